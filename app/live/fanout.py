"""Live fan-out of run updates to stream subscribers, within and across API processes.

::

    ingest commit ──note──▶ Hub.deliver ──▶ Feed (one per run per process)
                                              │ reads each new step once
                                              ▼
                          bounded queue per subscriber (put_nowait, never awaits)

A *note* says "run R has data up to step S" or "run R changed status". Notes
are hints, not data: what a subscriber is sent is always read from the
database, so a lost note costs a late read (every feed re-reads on its own
every ``resync_s``) and a spurious one costs a read that finds nothing.

Where notes come from (``app.live.notes``): on Postgres a ``NOTIFY`` issued inside
the storing transaction, which Postgres delivers at commit to every API process
that ``LISTEN``s (this one included, by ``PostgresListener``); on SQLite (the
embedded default, one API process) straight from the session's commit.

Why one feed per run: a thousand subscribers of one run cost one query per
step, and each frame is encoded once. Why bounded queues: a consumer that
stops reading fills only its own queue; it is then marked overflowed, stops
receiving, and on its next turn catches up from the database by itself. The
feed, the publisher and the other subscribers never wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from app.services import run_states

log = logging.getLogger("rlaas.fanout")


@dataclass(frozen=True, slots=True)
class Note:
    run_id: str
    step: int | None = None  # newest step stored, if points were stored
    status: bool = False  # the run's status changed


@dataclass(frozen=True, slots=True)
class Frame:
    """One encoded server-sent event; ``step`` orders metrics frames."""

    kind: Literal["metrics", "status", "end"]
    data: bytes
    step: int = -1
    status: str | None = None


END = Frame(kind="end", data=b"")


class FeedReader(Protocol):
    """How a feed reads the database (``app.live.stream.DatabaseReader``)."""

    async def state(self, run_id: str) -> tuple[str, int] | None:
        """(status, newest step stored), or None when there is no such run."""
        ...

    async def frames_after(
        self, run_id: str, after: int, upto: int | None
    ) -> tuple[list[Frame], bool]:
        """One page of metrics frames of steps in (after, upto], oldest first; and whether
        more may follow (``upto`` None: no upper bound)."""
        ...

    def status_frame(self, status: str) -> Frame: ...


class Subscription:
    """A subscriber's view of a feed: its queue and where the feed stood when it joined."""

    def __init__(self, feed: Feed, queue_size: int) -> None:
        self._feed = feed
        self.queue: asyncio.Queue[Frame] = asyncio.Queue(maxsize=queue_size)
        self.overflowed = False
        self.upto, self.status, self.done = feed.cursor, feed.status, feed.done

    def offer(self, frame: Frame) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.overflowed = True

    def rejoin(self) -> None:
        """After an overflow: forget the queue and take the feed's position again.

        Synchronous on purpose: nothing can be offered between taking the
        position and clearing the flag, so every later frame is queued.
        """
        while not self.queue.empty():
            self.queue.get_nowait()
        self.overflowed = False
        self.upto, self.status, self.done = self._feed.cursor, self._feed.status, self._feed.done


class Feed:
    """Reads one run's new steps and status once per change and hands them to its subscribers."""

    def __init__(self, run_id: str, reader: FeedReader, *, resync_s: float) -> None:
        self.run_id = run_id
        self.cursor = -1  # the newest step handed to subscribers
        self.status: str | None = None
        self.done = False  # terminal and drained: nothing more will come
        self.subscribers: set[Subscription] = set()
        self._reader = reader
        self._resync_s = resync_s
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        # Whether the next read must look at the run's status too: a note of new points
        # alone skips that query (one fewer round trip between a commit and its delivery).
        self._status_due = True
        self.holders = 0  # subscribers joined or joining; the hub drops the feed at 0
        self._task = asyncio.create_task(self._pump(), name=f"feed-{run_id}")

    async def join(self, queue_size: int) -> Subscription:
        await self._ready.wait()
        sub = Subscription(self, queue_size)
        self.subscribers.add(sub)
        return sub

    def poke(self, note: Note | None = None) -> None:
        if note is None or note.status:
            self._status_due = True
        # A note of a step already handed out (a retried batch, a late point) needs no read.
        handed_out = (
            note is not None
            and not note.status
            and note.step is not None
            and note.step <= self.cursor
        )
        if not handed_out:
            self._wake.set()

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _pump(self) -> None:
        while not self._ready.is_set():
            try:
                found = await self._reader.state(self.run_id)
            except Exception:
                log.exception("feed of %s could not read the run; retrying", self.run_id)
                await asyncio.sleep(1.0)
                continue
            if found is None:
                self.done = True
            else:
                self.status, self.cursor = found
                self.done = self.status in run_states.TERMINAL
            self._ready.set()
        while not self.done:
            try:
                await asyncio.wait_for(self._wake.wait(), self._resync_s)
            except TimeoutError:
                self._status_due = True  # the periodic resync reads everything
            self._wake.clear()
            try:
                await self._advance()
            except Exception:
                log.exception("feed of %s failed to read; retrying", self.run_id)
                self._status_due = True
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _advance(self) -> None:
        # Status first: once a run is terminal its lease is gone and no point can be
        # stored after it, so the metrics read below is the last one (drained).
        status = self.status
        if self._status_due:
            self._status_due = False
            found = await self._reader.state(self.run_id)
            status = found[0] if found is not None else None
        more = True
        while more:
            page, more = await self._reader.frames_after(self.run_id, self.cursor, None)
            for frame in page:
                self.cursor = frame.step
                self._emit(frame)
        if status is not None and status != self.status:
            self.status = status
            self._emit(self._reader.status_frame(status))
        if status is None or status in run_states.TERMINAL:
            self.done = True
            self._emit(END)

    def _emit(self, frame: Frame) -> None:
        for sub in self.subscribers:
            sub.offer(frame)


class Hub:
    """The feeds of this process, by run id. ``deliver`` never awaits."""

    def __init__(self, reader: FeedReader, *, queue_size: int = 256, resync_s: float = 5.0):
        self.reader = reader
        self._queue_size = queue_size
        self._resync_s = resync_s
        self._feeds: dict[str, Feed] = {}

    def deliver(self, notes: Iterable[Note]) -> None:
        for note in notes:
            feed = self._feeds.get(note.run_id)
            if feed is not None:
                feed.poke(note)

    def poke_all(self) -> None:
        """Every feed reads again: notes may have been lost (a dropped LISTEN connection)."""
        for feed in self._feeds.values():
            feed.poke()

    def subscribers(self, run_id: str) -> int:
        feed = self._feeds.get(run_id)
        return len(feed.subscribers) if feed is not None else 0

    @contextlib.asynccontextmanager
    async def subscribe(self, run_id: str) -> AsyncIterator[Subscription]:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = Feed(run_id, self.reader, resync_s=self._resync_s)
        feed.holders += 1
        sub: Subscription | None = None
        try:
            sub = await feed.join(self._queue_size)
            yield sub
        finally:
            feed.holders -= 1
            if sub is not None:
                feed.subscribers.discard(sub)
            if feed.holders == 0 and self._feeds.get(run_id) is feed:
                del self._feeds[run_id]
                await feed.stop()

    async def close(self) -> None:
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            await feed.stop()
