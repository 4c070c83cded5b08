"""Deferred step results: an environment posts one, the waiting worker long-polls for it.

A result is taken only for a step a worker awaits. The worker's long-poll makes
the step's row and keeps it awaited (``awaited_until``) while it waits; the
environment's post fills it in, once. So a result for a step nobody awaits (a run
that no longer runs, a step never deferred, a wait that is over) is refused, not
stored, and the reaper sweeps what rows remain (`sweep`).

The result is stored first and relayed second, so it survives the API process
that took it: a long-poll on another process finds it by polling the database
every ``callback_poll_s``; on the same process an in-process wake-up hands it
over at once. The same wake-up tells a post held for its step's first poll that
the poll has come.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.crypto import SecretBox
from app.db.models import EnvCallback, Environment, Run, utcnow
from app.errors import Conflict, Gone, NotFound
from app.security import LeaseProof
from app.services import run_states
from app.services.callback_bodies import authentic_body
from app.services.environments import ID_PREFIX, environment_name

Key = tuple[str, int]
# Only a run in these states has a worker that may wait on a deferred step.
WAITING = (run_states.STARTING, run_states.RUNNING)


class CallbackRelay:
    """Wakes this process's long-polls and held posts waiting on an (episode_id, step)."""

    def __init__(self) -> None:
        self._waiting: dict[Key, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def waiting(self, key: Key) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._waiting.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            events = self._waiting.get(key, set())
            events.discard(event)
            if not events:
                self._waiting.pop(key, None)

    def notify(self, key: Key) -> None:
        for event in self._waiting.get(key, ()):
            event.set()


class Taken(enum.Enum):
    STORED = "stored"
    ANSWERED = "answered"  # a result for the step was taken before
    OVER = "over"  # the worker awaited the step, and stopped
    UNAWAITED = "unawaited"  # no worker has awaited the step (yet)


def run_id_of(episode_id: str) -> str:
    """Workers name episodes ``<run_id>~<local id>`` (rl_core.pipeline.runner's episode_prefix)."""
    run_id, sep, _ = episode_id.partition("~")
    if not sep or not run_id:
        raise NotFound(
            f"episode id {episode_id!r} names no run; it must look like '<run_id>~<episode>'",
            field="episode_id",
        )
    return run_id


async def accept(
    sessions: async_sessionmaker[AsyncSession],
    relay: CallbackRelay,
    episode_id: str,
    step: int,
    raw: bytes,
    signature: str | None,
    box: SecretBox,
    *,
    hold_s: float,
    poll_s: float,
) -> None:
    """Verify a deferred result and store it for the worker awaiting its step.

    Refused: a bad signature (401), a body signed for another step or episode (403),
    a run that no longer runs or a step nobody awaits (410), a step answered before
    (409). A step not awaited yet is held up to ``hold_s`` for the worker's first
    poll, which the post can beat (it follows the 202 at once). Each look at the
    database is its own short transaction: a held post holds no connection.
    """
    run_id = run_id_of(episode_id)
    key = (episode_id, step)
    # Listening before the first look: a poll that starts in between still wakes us.
    with relay.waiting(key) as polled:
        async with sessions() as session:
            run, env = await _run_and_environment(session, run_id)
            secret = box.decrypt(env.secret_encrypted, context=env.id)
            body = authentic_body(secret, raw, signature, episode_id, step)
            if run.status not in WAITING:
                raise Gone(
                    f"run {run_id} is {run.status}; no worker waits for its results any more",
                    field="status",
                )
            taken = await _take(session, env.id, episode_id, step, body)
            await session.commit()
        deadline = time.monotonic() + hold_s
        while taken is Taken.UNAWAITED and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(polled.wait(), min(left, poll_s))
            polled.clear()
            async with sessions() as session:
                taken = await _take(session, env.id, episode_id, step, body)
                await session.commit()
    if taken is Taken.STORED:
        relay.notify(key)  # after the commit: a woken poll finds the row
        return
    where = f"episode {episode_id} step {step}"
    if taken is Taken.ANSWERED:
        raise Conflict(
            f"a result for {where} was taken already; a step is answered once (treat it "
            "as delivered)",
            field="step",
        )
    if taken is Taken.OVER:
        raise Gone(
            f"no worker waits for {where} any more: its wait ended (the step's deadline, "
            "environment.webhook.step_deadline_s, passed); drop the result",
            field="step",
        )
    raise Gone(
        f"no worker waits for {where}: the step was not deferred (answered 202) or its "
        "wait is over; drop the result",
        field="step",
    )


async def _run_and_environment(session: AsyncSession, run_id: str) -> tuple[Run, Environment]:
    run = await session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r} (from the episode id)", field="episode_id")
    env_id = environment_name(run.spec) or ""
    env = None
    if env_id.startswith(ID_PREFIX):
        env = await session.scalar(
            select(Environment).where(
                Environment.id == env_id, Environment.tenant_id == run.tenant_id
            )
        )
    if env is None:
        raise NotFound(
            f"run {run_id} does not use a registered environment; callbacks need one",
            field="episode_id",
        )
    return run, env


async def _take(
    session: AsyncSession, env_id: str, episode_id: str, step: int, body: dict[str, Any]
) -> Taken:
    """Store ``body`` if a worker awaits the step and it has no result yet."""
    at_key = (EnvCallback.episode_id == episode_id, EnvCallback.step == step)
    # Twice at most: the worker's poll may make the row between the UPDATE and the look.
    for _ in range(2):
        now = utcnow()
        # One conditional UPDATE: of two posts of the same step at once, one finds it taken.
        stored = await session.scalar(
            update(EnvCallback)
            .where(*at_key, EnvCallback.received_at.is_(None), EnvCallback.awaited_until > now)
            .values(body=body, received_at=now, environment_id=env_id)
            .returning(EnvCallback.step)
            .execution_options(synchronize_session=False)
        )
        if stored is not None:
            return Taken.STORED
        # Compared in SQL: SQLite gives the time back without its zone.
        awaited = (EnvCallback.awaited_until > now).label("awaited")
        row = (
            await session.execute(select(EnvCallback.received_at, awaited).where(*at_key))
        ).first()
        if row is None:
            return Taken.UNAWAITED
        if row.received_at is not None:
            return Taken.ANSWERED
        if not row.awaited:
            return Taken.OVER
    return Taken.UNAWAITED  # awaited, still unanswered, but not by this UPDATE: look again


async def wait_for(
    sessions: async_sessionmaker[AsyncSession],
    relay: CallbackRelay,
    run_id: str,
    lease: LeaseProof,
    episode_id: str,
    step: int,
    *,
    wait_s: float,
    poll_s: float,
    grace_s: float,
) -> dict[str, Any] | None:
    """The stored result (marked delivered), or None after ``wait_s``.

    First it marks the step awaited until ``wait_s`` + ``grace_s`` from now (the
    grace bridges the gap to the worker's next poll): only then is a result for it
    taken. Each look at the database is its own short transaction, so a long-poll
    holds no connection while it waits. A result fetched twice (the worker lost the
    first answer) is returned again: delivery is at least once.
    """
    if run_id_of(episode_id) != run_id:
        raise NotFound(f"episode {episode_id!r} is not one of run {run_id}", field="episode_id")
    key = (episode_id, step)
    with relay.waiting(key) as woken:
        async with sessions() as session:
            # Checked once per poll: a poll lasts at most a minute, and a worker whose lease
            # ended meanwhile learns it at its next heartbeat and stops.
            run = await session.get(Run, run_id)
            if run is None or not lease.opens(run.lease_token_hash):
                raise lease.refusal(run_id)
            until = utcnow() + timedelta(seconds=wait_s + grace_s)
            await _mark_awaited(session, run_id, episode_id, step, until)
            await session.commit()
        relay.notify(key)  # a post held for this step's first poll goes on
        deadline = time.monotonic() + wait_s
        while True:
            woken.clear()
            async with sessions() as session:
                row = await session.get(EnvCallback, key)
                if row is not None and row.received_at is not None:
                    if row.delivered_at is None:
                        row.delivered_at = utcnow()
                        await session.commit()
                    return row.body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(remaining, poll_s))


async def _mark_awaited(
    session: AsyncSession, run_id: str, episode_id: str, step: int, until: Any
) -> None:
    """Make the step's row, or move its ``awaited_until`` to ``until`` (the newest poll's:
    near the step's deadline the worker polls for less, and the wait ends sooner)."""
    insert = pg_insert if session.bind.dialect.name == "postgresql" else sqlite_insert
    stmt = insert(EnvCallback).values(
        episode_id=episode_id, step=step, run_id=run_id, awaited_until=until
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["episode_id", "step"],
        set_={"awaited_until": stmt.excluded.awaited_until},
    )
    await session.execute(stmt)


async def sweep(session: AsyncSession, *, retention_s: float) -> int:
    """Delete the rows of runs that no longer run, and the rows nobody has awaited for
    ``retention_s``; returns how many went.

    Aged by ``awaited_until``, not by when the row was made: a step may be awaited
    for as long as its deadline (up to a day), and its row must last that long.
    """
    cutoff = utcnow() - timedelta(seconds=retention_s)
    live = (
        select(Run.id)
        .where(Run.id == EnvCallback.run_id, Run.status.in_(WAITING))
        .correlate(EnvCallback)
    )
    gone = await session.scalars(
        delete(EnvCallback)
        .where(or_(EnvCallback.awaited_until < cutoff, ~live.exists()))
        .returning(EnvCallback.step)
        .execution_options(synchronize_session=False)
    )
    return len(gone.all())
