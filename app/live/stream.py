"""The live metrics stream of a run, as server-sent events.

One event per step::

    id: 12
    event: metrics
    data: {"step": 12, "metrics": {"loss": 0.4, "reward/mean": 0.7}}

``event: status`` (no id, so a reconnect's Last-Event-ID stays the last step)
when the stream opens and on every transition; a ``: keep-alive`` comment
when nothing happened for a while; the stream ends once the run is terminal
and every step has been sent. A stream is per step: a point stored later for
a step already sent is not sent again (``GET /v1/runs/{id}/metrics`` has it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from itertools import groupby

from sqlalchemy import make_url, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import MetricPoint, Run
from app.db.session import make_engine
from app.live import notes
from app.live.fanout import Frame, Hub

KEEPALIVE = b": keep-alive\n\n"
RETRY = b"retry: 2000\n\n"  # how long a browser's EventSource waits before reconnecting


def metrics_frame(step: int, metrics: dict[str, float]) -> Frame:
    data = json.dumps({"step": step, "metrics": metrics}, separators=(",", ":"))
    return Frame(
        kind="metrics", step=step, data=f"id: {step}\nevent: metrics\ndata: {data}\n\n".encode()
    )


def status_frame(status: str) -> Frame:
    data = json.dumps({"status": status})
    return Frame(kind="status", status=status, data=f"event: status\ndata: {data}\n\n".encode())


class DatabaseReader:
    """``app.live.fanout.FeedReader`` over the app's sessions; also the catch-up reads."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, page_points: int = 5000):
        self._sessions = sessions
        self._page = page_points

    async def state(self, run_id: str) -> tuple[str, int] | None:
        async with self._sessions() as session:
            row = (
                await session.execute(select(Run.status, Run.current_step).where(Run.id == run_id))
            ).first()
        return None if row is None else (row[0], row[1])

    async def frames_after(
        self, run_id: str, after: int, upto: int | None
    ) -> tuple[list[Frame], bool]:
        query = select(MetricPoint.step, MetricPoint.name, MetricPoint.value).where(
            MetricPoint.run_id == run_id, MetricPoint.step > after
        )
        if upto is not None:
            query = query.where(MetricPoint.step <= upto)
        query = query.order_by(MetricPoint.step, MetricPoint.name).limit(self._page + 1)
        async with self._sessions() as session:
            rows = (await session.execute(query)).all()
        more = len(rows) > self._page
        steps = [(step, list(group)) for step, group in groupby(rows, key=lambda r: r[0])]
        if more and len(steps) > 1:
            steps.pop()  # the page may have cut the last step short: read it whole next time
        elif more:
            # One step with more points than a page: read that step alone, whole.
            return await self._one_step(run_id, steps[0][0]), True
        return [metrics_frame(step, {r[1]: r[2] for r in group}) for step, group in steps], more

    async def _one_step(self, run_id: str, step: int) -> list[Frame]:
        async with self._sessions() as session:
            rows = (
                await session.execute(
                    select(MetricPoint.name, MetricPoint.value).where(
                        MetricPoint.run_id == run_id, MetricPoint.step == step
                    )
                )
            ).all()
        return [metrics_frame(step, {name: value for name, value in rows})]

    def status_frame(self, status: str) -> Frame:
        return status_frame(status)


async def metrics_events(
    hub: Hub, run_id: str, *, after: int, keepalive_s: float = 15.0
) -> AsyncIterator[bytes]:
    """The stream of one subscriber: catch up from the database, then follow the hub."""
    reader = hub.reader
    yield RETRY
    async with hub.subscribe(run_id) as sub:
        last, sent_status = after, None
        while True:
            # Everything up to where the feed stood when we joined (or overflowed) comes
            # from the database; everything after it comes through the queue.
            more = True
            while more and last < sub.upto:
                page, more = await reader.frames_after(run_id, last, sub.upto)
                for frame in page:
                    yield frame.data
                    last = frame.step
            if sub.status is not None and sub.status != sent_status:
                yield status_frame(sub.status).data
                sent_status = sub.status
            if sub.done:
                return
            while not sub.overflowed:
                try:
                    # asyncio.timeout, not wait_for: no extra task per frame, which a
                    # thousand subscribers of one run would pay on every step.
                    async with asyncio.timeout(keepalive_s):
                        frames = [await sub.queue.get()]
                except TimeoutError:
                    yield KEEPALIVE
                    continue
                while not sub.queue.empty():  # what piled up goes out in one write
                    frames.append(sub.queue.get_nowait())
                out = []
                for frame in frames:
                    if frame.kind == "end":
                        break
                    if frame.kind == "metrics" and frame.step > last:
                        out.append(frame.data)
                        last = frame.step
                    elif frame.kind == "status" and frame.status != sent_status:
                        out.append(frame.data)
                        sent_status = frame.status
                if out:
                    yield b"".join(out)
                if any(f.kind == "end" for f in frames):
                    return
            sub.rejoin()


@contextlib.asynccontextmanager
async def live_updates(
    sessions: async_sessionmaker[AsyncSession], database_url: str, *, resync_s: float = 5.0
) -> AsyncIterator[Hub]:
    """The lifespan's fan-out: a hub fed by LISTEN on Postgres, by commits on SQLite."""
    listener: notes.PostgresListener | None = None
    postgres = make_url(database_url).get_backend_name() == "postgresql"
    reads, read_engine = sessions, None
    if postgres:
        # The feeds only read, one statement at a time: on an autocommit engine of their
        # own each read is one round trip, not BEGIN, SELECT and ROLLBACK (three, on the
        # path of every step's delivery).
        read_engine = make_engine(database_url, pool_size=4, autocommit=True)
        reads = async_sessionmaker(read_engine)
    hub = Hub(DatabaseReader(reads), resync_s=resync_s)
    if postgres:
        notes.install(sessions, deliver_after_commit=None)
        conninfo = make_url(database_url).set(drivername="postgresql")
        listener = notes.PostgresListener(
            conninfo.render_as_string(hide_password=False), hub.deliver, hub.poke_all
        )
        await listener.start(timeout_s=3.0)
    else:
        notes.install(sessions, deliver_after_commit=hub.deliver)
    try:
        yield hub
    finally:
        if listener is not None:
            await listener.close()
        await hub.close()
        if read_engine is not None:
            await read_engine.dispose()
