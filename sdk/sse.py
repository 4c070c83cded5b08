"""A server-sent-events parser (the HTML spec's event-stream rules), for the live stream.

Fed line by line (``httpx.Response.iter_lines`` splits on \\n, \\r\\n and \\r);
yields an ``SseEvent`` at each blank line that ends an event with data.
Comments (``: keep-alive``) and unknown fields are skipped. An event cut off
by the end of the stream is dropped, as the spec says: the reconnect asks
again from the last complete id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    id: str | None


def parse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    event, last_id = "", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseEvent(event=event or "message", data="\n".join(data), id=last_id)
            event, data, last_id = "", [], None
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            last_id = value
