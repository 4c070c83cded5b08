"""The answer to a legacy completions request, ``text_completion``, and its SSE stream.

Serialised as OpenAI sends it: ``logprobs`` is null unless asked for. With
``logprobs: 0`` it holds, for each token the answer stands for (`rl_core.sessions.stop`:
up to the one that completes a stop string), the token as text (special tokens
spelled out), its logprob under the run's sampler, a ``top_logprobs`` entry with the
sampled token alone, and its ``text_offset``: where the token starts, in characters
from the start of the prompt, counting the tokens' texts as ``tokens`` spells them.

``stream: true`` replays a finished answer (the engine returns whole completions) as
``text_completion`` chunks, in the order OpenAI sends them: the text in pieces of
``piece_chars`` characters, then a chunk with no text and the ``finish_reason`` (and
the logprobs, when asked), then, with ``stream_options.include_usage``, a chunk with
no choices and the usage; each a server-sent event, then ``data: [DONE]``. Joining
the pieces gives back the answer's text.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import BaseModel

from rl_core.protocol.chat_completions.answer import SparseModel, Usage
from rl_core.protocol.chat_completions.stream import sse_events

TextFinishReason = Literal["stop", "length"]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
    finish_reason: TextFinishReason


class TextCompletion(BaseModel):
    """``text_completion``: the answer to a request without ``stream``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), ensure_ascii=False)


class TextChunkChoice(SparseModel):
    _keep_null: ClassVar[frozenset[str]] = frozenset({"logprobs", "finish_reason"})

    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
    finish_reason: TextFinishReason | None = None


class TextCompletionChunk(SparseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChunkChoice]
    usage: Usage | None = None


def text_completion_chunks(
    completion: TextCompletion, *, include_usage: bool = False, piece_chars: int = 16
) -> list[TextCompletionChunk]:
    """The chunk sequence of ``completion`` (without the final ``[DONE]``)."""
    if piece_chars < 1:
        raise ValueError("piece_chars must be at least 1")

    def chunk(choices: list[TextChunkChoice], usage: Usage | None = None) -> TextCompletionChunk:
        return TextCompletionChunk(
            id=completion.id,
            created=completion.created,
            model=completion.model,
            choices=choices,
            usage=usage,
        )

    out: list[TextCompletionChunk] = []
    for choice in completion.choices:
        text = choice.text
        for start in range(0, len(text), piece_chars):
            piece = text[start : start + piece_chars]
            out.append(chunk([TextChunkChoice(text=piece, index=choice.index)]))
        finish = TextChunkChoice(
            text="",
            index=choice.index,
            logprobs=choice.logprobs,
            finish_reason=choice.finish_reason,
        )
        out.append(chunk([finish]))
    if include_usage:
        out.append(chunk([], usage=completion.usage))
    return out


def stream_text_completion(
    completion: TextCompletion, *, include_usage: bool = False, piece_chars: int = 16
) -> list[str]:
    """The whole event stream of ``completion``, ``[DONE]`` last."""
    chunks = text_completion_chunks(
        completion, include_usage=include_usage, piece_chars=piece_chars
    )
    return list(sse_events(chunks))


__all__ = [
    "CompletionChoice",
    "CompletionLogprobs",
    "TextChunkChoice",
    "TextCompletion",
    "TextCompletionChunk",
    "TextFinishReason",
    "stream_text_completion",
    "text_completion_chunks",
]
