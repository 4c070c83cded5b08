"""OpenAI's Responses API (``POST /responses``): a session URL's third route.

What ``client.responses.create(...)`` sends and reads (the openai package 3.x, and
openai-agents' default model class), served by translation onto the chat core so a
call is rendered, sampled and recorded exactly as a chat call (docs/sessions.md):

- `request`: ``ResponsesRequest`` and `parse_responses_request` (what is served,
  accepted and refused is listed there; refusals are
  `rl_core.protocol.chat_completions.ChatCompletionError`, OpenAI's error body);
- `translate`: the request as a chat request (`to_chat`), the chat answer as a
  ``response`` (`from_chat`);
- `answer`: the ``response`` object;
- `stream`: a finished response as the Responses API's server-sent events.
"""

from __future__ import annotations

from rl_core.protocol.responses.answer import (
    FunctionCallOutput,
    OutputMessageItem,
    OutputText,
    Response,
    ResponseUsage,
    not_found,
)
from rl_core.protocol.responses.request import (
    LOGPROBS_INCLUDE,
    ResponsesRequest,
    parse_responses_request,
)
from rl_core.protocol.responses.stream import response_events, stream_response
from rl_core.protocol.responses.translate import chat_error, from_chat, input_messages, to_chat

__all__ = [
    "LOGPROBS_INCLUDE",
    "FunctionCallOutput",
    "OutputMessageItem",
    "OutputText",
    "Response",
    "ResponseUsage",
    "ResponsesRequest",
    "chat_error",
    "from_chat",
    "input_messages",
    "not_found",
    "parse_responses_request",
    "response_events",
    "stream_response",
    "to_chat",
]
