"""OpenAI chat completions: the bodies a session URL takes and answers (pure pydantic).

A client runs its own agent loop with the official ``openai`` client pointed at a
session URL (`rl_core.sessions`, docs/sessions.md); these are the wire half:

- `request`: ``ChatCompletionRequest`` and `parse_request` (what is served, accepted
  or refused is listed there); `messages`: the messages, and the echoed fields that
  are accepted; `errors`: `ChatCompletionError`, OpenAI's error body, naming every
  field a request gets wrong or that is not served;
- `answer`: ``chat.completion`` (`ChatCompletion`);
- `stream`: a finished answer as ``chat.completion.chunk`` server-sent events.

They live in ``protocol`` because they cross processes: whichever process ends up
holding the HTTP route (the control plane or a worker) validates with these.
"""

from __future__ import annotations

from rl_core.protocol.chat_completions.answer import (
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    FinishReason,
    FunctionCallOut,
    ReplyMessage,
    TokenLogprob,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from rl_core.protocol.chat_completions.errors import ChatCompletionError, Problem, refusal
from rl_core.protocol.chat_completions.request import (
    AssistantMessage,
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    Message,
    NamedToolChoice,
    SystemMessage,
    Tool,
    ToolMessage,
    UserMessage,
    parse_request,
)
from rl_core.protocol.chat_completions.stream import (
    ChatCompletionChunk,
    completion_chunks,
    sse_events,
    stream_completion,
)

__all__ = [
    "AssistantMessage",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionError",
    "ChatCompletionRequest",
    "Choice",
    "ChoiceLogprobs",
    "FinishReason",
    "FunctionCallOut",
    "JsonObjectFormat",
    "JsonSchemaFormat",
    "Message",
    "NamedToolChoice",
    "Problem",
    "ReplyMessage",
    "SystemMessage",
    "TokenLogprob",
    "Tool",
    "ToolCallOut",
    "ToolMessage",
    "TopLogprob",
    "Usage",
    "UserMessage",
    "completion_chunks",
    "parse_request",
    "refusal",
    "sse_events",
    "stream_completion",
]
