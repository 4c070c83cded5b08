"""Where the fan-out's notes (``app.live.fanout.Note``) come from.

A service that stores points calls ``note_step(session, run_id, step)``; a
status change needs nothing: every transition adds a ``RunEvent`` row and a
session hook sees it flushed. The notes wait in ``session.info`` and leave
with the commit, never before it and never after a rollback:

- Postgres: ``SELECT pg_notify(...)`` inside the transaction, just before it
  commits. Postgres delivers a NOTIFY only if the transaction commits, to
  every connection that LISTENs on the channel, in commit order: every API
  process, this one included, hears it through its ``PostgresListener``.
- SQLite (embedded, one API process): handed to the local hub after commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, UOWTransaction

from app.db.models import RunEvent
from app.live.fanout import Note

log = logging.getLogger("rlaas.notes")

CHANNEL = "rlaas_runs"
_KEY = "rlaas_notes"


def note_step(session: AsyncSession, run_id: str, step: int) -> None:
    """Say that ``run_id`` has points up to ``step`` once this transaction commits."""
    _mark(session.sync_session, run_id, step=step)


def _mark(session: Session, run_id: str, *, step: int | None = None, status: bool = False) -> None:
    notes: dict[str, list[Any]] = session.info.setdefault(_KEY, {})
    entry = notes.setdefault(run_id, [None, False])
    if step is not None:
        entry[0] = step if entry[0] is None else max(entry[0], step)
    entry[1] = entry[1] or status


def _take(session: Session) -> list[Note]:
    notes: dict[str, list[Any]] = session.info.pop(_KEY, {})
    return [Note(run_id=r, step=s, status=st) for r, (s, st) in notes.items()]


def encode(note: Note) -> str:
    return json.dumps({"run": note.run_id, "step": note.step, "status": note.status})


def decode(payload: str) -> Note | None:
    try:
        raw = json.loads(payload)
        step = raw["step"]
        return Note(run_id=str(raw["run"]), step=None if step is None else int(step),
                    status=bool(raw["status"]))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        log.warning("ignored a malformed note on %s: %.200r", CHANNEL, payload)
        return None


def install(
    sessions: async_sessionmaker[AsyncSession],
    *,
    deliver_after_commit: Callable[[Iterable[Note]], None] | None,
) -> None:
    """Give ``sessions`` the note hooks.

    ``deliver_after_commit`` None means Postgres: notes go out as NOTIFY in the
    transaction. Otherwise they are handed to it after each commit.
    """

    # A subclass per app, so two apps in one process (tests) keep their own hooks.
    class NotingSession(Session):
        pass

    @event.listens_for(NotingSession, "after_flush")
    def _status_changes(session: Session, _flush: UOWTransaction) -> None:
        for obj in session.new:
            if isinstance(obj, RunEvent):
                _mark(session, obj.run_id, status=True)

    @event.listens_for(NotingSession, "after_rollback")
    def _forget(session: Session) -> None:
        session.info.pop(_KEY, None)

    if deliver_after_commit is None:

        @event.listens_for(NotingSession, "before_commit")
        def _notify(session: Session) -> None:
            session.flush()  # RunEvents still pending are notes too
            notes = _take(session)
            if notes:
                session.execute(
                    text("SELECT pg_notify(:channel, p) FROM unnest(CAST(:payloads AS text[])) p"),
                    {"channel": CHANNEL, "payloads": [encode(n) for n in notes]},
                )

    else:
        deliver = deliver_after_commit

        @event.listens_for(NotingSession, "after_commit")
        def _deliver(session: Session) -> None:
            notes = _take(session)
            if notes:
                deliver(notes)

    sessions.configure(sync_session_class=NotingSession)


class PostgresListener:
    """LISTENs on the notes channel and hands each note to ``deliver``; reconnects on loss.

    One psycopg connection per API process, held by the lifespan. After a
    reconnect ``resync`` is called: notes sent while it was away are lost.
    """

    def __init__(
        self,
        conninfo: str,
        deliver: Callable[[Iterable[Note]], None],
        resync: Callable[[], None],
    ) -> None:
        self._conninfo = conninfo
        self._deliver = deliver
        self._resync = resync
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    async def start(self, timeout_s: float = 10.0) -> None:
        self._task = asyncio.create_task(self._run(), name="notes-listener")
        # Wait for the first LISTEN, so a stream opened right after start-up hears everything.
        # A database that is down must not stop the API from starting (/readyz says 503);
        # the task keeps reconnecting, and the feeds' resync covers what it missed.
        try:
            await asyncio.wait_for(self.listening.wait(), timeout_s)
        except TimeoutError:
            log.warning("notes listener not connected after %.0fs; still trying", timeout_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if self.listening.is_set():
                        self._resync()
                    self.listening.set()
                    backoff = 0.2
                    async for message in conn.notifies():
                        note = decode(message.payload)
                        if note is not None:
                            self._deliver((note,))
            except psycopg.Error as exc:
                log.warning("notes listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
