"""OpenAI's legacy text completions (``POST /completions``): a session URL's second route.

What ``client.completions.create(model=..., prompt=...)`` sends and reads, for a client
that formats its own prompts (`rl_core.sessions`, docs/sessions.md):

- `request`: ``CompletionRequest`` and `parse_completion_request` (refusals are
  `rl_core.protocol.chat_completions.ChatCompletionError`, OpenAI's error body; what is
  served is listed there);
- `answer`: ``text_completion`` (`TextCompletion`) and its server-sent event stream.
"""

from __future__ import annotations

from rl_core.protocol.completions.answer import (
    CompletionChoice,
    CompletionLogprobs,
    TextCompletion,
    TextCompletionChunk,
    TextFinishReason,
    stream_text_completion,
    text_completion_chunks,
)
from rl_core.protocol.completions.request import (
    DEFAULT_MAX_TOKENS,
    CompletionRequest,
    parse_completion_request,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "TextCompletion",
    "TextCompletionChunk",
    "TextFinishReason",
    "parse_completion_request",
    "stream_text_completion",
    "text_completion_chunks",
]
