"""A finished ``response`` as the Responses API's server-sent events.

The session answers once the engine has finished the call (as for chat,
`rl_core.protocol.chat_completions.stream`), so ``stream: true`` replays the finished
response in the event sequence the official clients (openai 3.x's
``ResponseStreamEvent``, openai-agents' stream handler) read:

1. ``response.created``, then ``response.in_progress`` (the response, no output yet);
2. per output item, at ``output_index``:

   - a message: ``response.output_item.added`` (no content yet),
     ``response.content_part.added`` (an empty ``output_text``),
     ``response.output_text.delta`` (the text in pieces),
     ``response.output_text.done``, ``response.content_part.done``,
     ``response.output_item.done`` (the whole item);
   - a function call: ``response.output_item.added`` (its arguments empty),
     ``response.function_call_arguments.delta`` (in pieces),
     ``response.function_call_arguments.done``, ``response.output_item.done``;

3. ``response.completed`` (or ``response.incomplete``), with the whole response.

Each event is ``event: <type>`` and ``data: <json>`` with a ``sequence_number``
counting from 0; the stream ends there (no ``[DONE]`` on this API).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from rl_core.protocol.responses.answer import (
    FunctionCallOutput,
    OutputMessageItem,
    OutputText,
    Response,
)


def response_events(response: Response, *, piece_chars: int = 16) -> list[dict[str, Any]]:
    """The events of ``response``, in order, as JSON-ready dicts."""
    if piece_chars < 1:
        raise ValueError("piece_chars must be at least 1")
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = response.as_started().model_dump(mode="json")
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response.output):
        whole = item.model_dump(mode="json")
        if isinstance(item, OutputMessageItem):
            opening = item.model_copy(update={"status": "in_progress", "content": []})
            emit("response.output_item.added", output_index=index, item=opening.model_dump())
            for part_index, part in enumerate(item.content):
                where = {"item_id": item.id, "output_index": index, "content_index": part_index}
                empty = OutputText(text="", logprobs=[] if part.logprobs is not None else None)
                emit("response.content_part.added", **where, part=empty.model_dump(mode="json"))
                for piece in _pieces(part.text, piece_chars):
                    emit("response.output_text.delta", **where, delta=piece, logprobs=[])
                logprobs = [lp.model_dump(mode="json") for lp in part.logprobs or ()]
                emit("response.output_text.done", **where, text=part.text, logprobs=logprobs)
                emit("response.content_part.done", **where, part=part.model_dump(mode="json"))
        elif isinstance(item, FunctionCallOutput):
            opening_call = item.model_copy(update={"status": "in_progress", "arguments": ""})
            emit("response.output_item.added", output_index=index, item=opening_call.model_dump())
            where = {"item_id": item.id, "output_index": index}
            for piece in _pieces(item.arguments, piece_chars):
                emit("response.function_call_arguments.delta", **where, delta=piece)
            emit(
                "response.function_call_arguments.done",
                **where,
                name=item.name,
                arguments=item.arguments,
            )
        emit("response.output_item.done", output_index=index, item=whole)
    final = "response.incomplete" if response.status == "incomplete" else "response.completed"
    emit(final, response=response.model_dump(mode="json"))
    return events


def stream_response(response: Response, *, piece_chars: int = 16) -> list[str]:
    """The whole server-sent event stream of ``response``."""
    return [
        f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        for event in response_events(response, piece_chars=piece_chars)
    ]


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


__all__ = ["response_events", "stream_response"]
