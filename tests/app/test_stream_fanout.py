"""The hub and the subscriber loop (``app.live.fanout``, ``app.live.stream``) over a fake reader.

A unit test of the fan-out alone: the database is replaced by an in-memory
``FeedReader`` so a slow consumer and an overflow can be set up exactly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from app.live.fanout import Frame, Hub, Note
from app.live.stream import metrics_events, metrics_frame, status_frame

pytestmark = pytest.mark.anyio
RUN = "run_x"


class MemoryReader:
    """Steps and a status in memory; pages of ``page`` steps, like the database reader."""

    def __init__(self, page: int = 3) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.status = "running"
        self.page = page
        self.reads = 0

    async def state(self, run_id: str) -> tuple[str, int] | None:
        return self.status, max(self.steps, default=0)

    async def frames_after(
        self, run_id: str, after: int, upto: int | None
    ) -> tuple[list[Frame], bool]:
        self.reads += 1
        wanted = sorted(s for s in self.steps if s > after and (upto is None or s <= upto))
        page = wanted[: self.page]
        return [metrics_frame(s, self.steps[s]) for s in page], len(wanted) > self.page

    def status_frame(self, status: str) -> Frame:
        return status_frame(status)


def parse(chunks: list[bytes]) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) of each event; comments and the retry hint left out."""
    out = []
    for block in b"".join(chunks).decode().split("\n\n"):  # one write may carry several
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


async def settle() -> None:
    for _ in range(20):  # let the feed's pump run its reads
        await asyncio.sleep(0)


async def publish(hub: Hub, reader: MemoryReader, step: int) -> None:
    reader.steps[step] = {"loss": 1.0 / step}
    hub.deliver([Note(run_id=RUN, step=step)])
    await settle()


async def test_a_slow_subscriber_overflows_alone_and_the_others_get_every_step() -> None:
    reader = MemoryReader()
    hub = Hub(reader, queue_size=4, resync_s=3600)
    async with hub.subscribe(RUN) as slow, hub.subscribe(RUN) as fast:
        got: list[int] = []
        for step in range(1, 41):
            await publish(hub, reader, step)
            while not fast.queue.empty():
                got.append(fast.queue.get_nowait().step)
        assert got == list(range(1, 41))
        assert slow.overflowed and slow.queue.qsize() == 4  # stopped at its bound
        slow.rejoin()
        assert not slow.overflowed and slow.queue.empty() and slow.upto == 40
    await hub.close()


async def test_a_stream_that_overflowed_catches_up_from_the_reader_without_gaps() -> None:
    reader = MemoryReader(page=3)
    reader.steps = {1: {"loss": 1.0}, 2: {"loss": 0.5}}
    hub = Hub(reader, queue_size=2, resync_s=3600)
    stream = metrics_events(hub, RUN, after=0, keepalive_s=3600)
    chunks = [await anext(stream) for _ in range(4)]  # retry hint, steps 1 and 2, status
    assert [e for e, _ in parse(chunks)] == ["metrics", "metrics", "status"]
    # The consumer stops reading while 25 steps are published: its queue overflows.
    for step in range(3, 28):
        await publish(hub, reader, step)
    reader.status = "succeeded"
    hub.deliver([Note(run_id=RUN, status=True)])
    await settle()
    rest = [chunk async for chunk in stream]  # ends by itself: terminal and drained
    events = parse(chunks + rest)
    steps = [data["step"] for name, data in events if name == "metrics"]
    assert steps == list(range(1, 28))  # every step once, in order
    assert [data for name, data in events if name == "status"] == [
        {"status": "running"},
        {"status": "succeeded"},
    ]
    assert hub.subscribers(RUN) == 0
    await hub.close()


async def test_a_note_of_a_step_already_sent_costs_no_read() -> None:
    reader = MemoryReader()
    hub = Hub(reader, queue_size=8, resync_s=3600)
    async with hub.subscribe(RUN) as sub:
        await publish(hub, reader, 1)
        reads = reader.reads
        hub.deliver([Note(run_id=RUN, step=1)])  # a retried batch
        await settle()
        assert reader.reads == reads
        assert sub.queue.get_nowait().step == 1
    await hub.close()


async def test_the_feed_closes_when_its_last_subscriber_is_cancelled() -> None:
    reader = MemoryReader()
    hub = Hub(reader, resync_s=3600)

    async def hold(ready: asyncio.Event) -> AsyncIterator[None]:
        async with hub.subscribe(RUN):
            ready.set()
            await asyncio.sleep(3600)
        yield

    ready = asyncio.Event()
    task = asyncio.create_task(anext(hold(ready)))
    await ready.wait()
    assert hub.subscribers(RUN) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hub.subscribers(RUN) == 0
    await hub.close()
