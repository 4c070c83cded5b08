"""OpenAI chat-completion streaming: a finished answer as ``chat.completion.chunk`` events.

The session answers a call only once the engine has finished it (the engine returns
whole completions, and the reply is parsed for tool calls only when it is whole), so
``stream: true`` replays a finished `ChatCompletion` as OpenAI's chunk sequence, in the
order the official clients accumulate:

1. a role delta, ``{"role": "assistant", "content": ""}`` (no content when the
   reply is tool calls only: its content is null);
2. content deltas (the content in pieces of ``piece_chars`` characters);
3. per tool call, a delta that opens it (``index``, ``id``, ``type``, ``name``,
   ``arguments: ""``), then its arguments in pieces;
4. a finish chunk: an empty delta with ``finish_reason`` (and the logprobs, when asked);
5. with ``stream_options.include_usage``, a chunk with no choices and the usage;
6. ``data: [DONE]``.

Each is one server-sent event, ``data: <json>\\n\\n``. Joining the deltas gives back
the answer's message exactly (a test reassembles them as a client does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import ClassVar, Literal

from pydantic import BaseModel

from rl_core.protocol.chat_completions.answer import (
    ChatCompletion,
    ChoiceLogprobs,
    FinishReason,
    SparseModel,
    Usage,
)

DONE = "data: [DONE]\n\n"


class DeltaFunction(SparseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(SparseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction | None = None


class Delta(SparseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(SparseModel):
    _keep_null: ClassVar[frozenset[str]] = frozenset({"logprobs", "finish_reason"})

    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(SparseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


def completion_chunks(
    completion: ChatCompletion, *, include_usage: bool = False, piece_chars: int = 16
) -> list[ChatCompletionChunk]:
    """The chunk sequence of ``completion`` (without the final ``[DONE]``)."""
    if piece_chars < 1:
        raise ValueError("piece_chars must be at least 1")

    def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=completion.id,
            created=completion.created,
            model=completion.model,
            choices=choices,
            usage=usage,
        )

    out: list[ChatCompletionChunk] = []
    for choice in completion.choices:
        index, message = choice.index, choice.message

        def delta(d: Delta, index: int = index) -> ChatCompletionChunk:
            return chunk([ChunkChoice(index=index, delta=d)])

        # A reply of tool calls only has null content, and a client must rebuild null.
        opening_content = None if message.content is None else ""
        out.append(delta(Delta(role="assistant", content=opening_content)))
        out.extend(delta(Delta(content=p)) for p in _pieces(message.content or "", piece_chars))
        for i, call in enumerate(message.tool_calls or ()):
            opening = DeltaToolCall(
                index=i,
                id=call.id,
                type="function",
                function=DeltaFunction(name=call.function.name, arguments=""),
            )
            out.append(delta(Delta(tool_calls=[opening])))
            for piece in _pieces(call.function.arguments, piece_chars):
                part = DeltaToolCall(index=i, function=DeltaFunction(arguments=piece))
                out.append(delta(Delta(tool_calls=[part])))
        finish = ChunkChoice(
            index=index,
            delta=Delta(),
            logprobs=choice.logprobs,
            finish_reason=choice.finish_reason,
        )
        out.append(chunk([finish]))
    if include_usage:
        out.append(chunk([], usage=completion.usage))
    return out


def sse_events(chunks: Iterable[BaseModel]) -> Iterator[str]:
    """Each chunk as a server-sent event, then ``data: [DONE]``."""
    for c in chunks:
        yield "data: " + json.dumps(c.model_dump(mode="json"), ensure_ascii=False) + "\n\n"
    yield DONE


def stream_completion(
    completion: ChatCompletion, *, include_usage: bool = False, piece_chars: int = 16
) -> list[str]:
    """The whole event stream of ``completion``, ``[DONE]`` last."""
    chunks = completion_chunks(completion, include_usage=include_usage, piece_chars=piece_chars)
    return list(sse_events(chunks))


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


__all__ = [
    "DONE",
    "ChatCompletionChunk",
    "ChunkChoice",
    "Delta",
    "DeltaFunction",
    "DeltaToolCall",
    "completion_chunks",
    "sse_events",
    "stream_completion",
]
