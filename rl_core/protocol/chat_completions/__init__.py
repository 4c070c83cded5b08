"""OpenAI chat completions: the bodies a session URL takes and answers (pure pydantic).

A client runs its own agent loop with the official ``openai`` client pointed at a
session URL (`rl_core.sessions`, docs/sessions.md); these are the wire half:

- `request`: ``ChatCompletionRequest``, `parse_request`, and `ChatCompletionError`,
  OpenAI's error body naming the field a request gets wrong or that is not served
  (what is served is listed there);
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
    Usage,
)
from rl_core.protocol.chat_completions.request import (
    AssistantMessage,
    ChatCompletionError,
    ChatCompletionRequest,
    Message,
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
    "Message",
    "ReplyMessage",
    "SystemMessage",
    "TokenLogprob",
    "Tool",
    "ToolCallOut",
    "ToolMessage",
    "Usage",
    "UserMessage",
    "completion_chunks",
    "parse_request",
    "sse_events",
    "stream_completion",
]
