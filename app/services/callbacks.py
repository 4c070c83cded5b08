"""Deferred step results: an environment posts one, the waiting worker long-polls for it.

The result is stored first and relayed second, so it survives the API process
that took it: a long-poll on another process finds it by polling the database
every ``callback_poll_s``; on the same process an in-process wake-up hands it
over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.crypto import SecretBox
from app.db.models import EnvCallback, Environment, Run, utcnow
from app.errors import Conflict, NotFound, Unauthorized, Unprocessable
from app.services import run_states
from app.services.environments import ID_PREFIX, environment_name
from rl_core.protocol.signing import HEADER, SignatureError, verify
from rl_core.protocol.webhook import parse_callback, problems

Key = tuple[str, int]


class CallbackRelay:
    """Wakes the long-polls of this process waiting on an (episode_id, step)."""

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
    session: AsyncSession,
    episode_id: str,
    step: int,
    raw: bytes,
    signature: str | None,
    box: SecretBox,
) -> EnvCallback:
    """Verify and store a deferred result once; a second post of the same step is a 409."""
    run_id = run_id_of(episode_id)
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
    try:
        verify(box.decrypt(env.secret_encrypted, context=env.id), raw, signature)
    except SignatureError as exc:
        raise Unauthorized(
            f"{exc}; sign the raw body with the environment's secret", field=HEADER
        ) from None
    if run.status not in (run_states.STARTING, run_states.RUNNING):
        raise Conflict(f"run {run_id} is {run.status}; no episode waits any more", field="status")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Unprocessable(f"body is not valid JSON: {exc}", field="body") from None
    if not isinstance(body, dict):
        raise Unprocessable("body must be a JSON object (the step's result)", field="body")
    try:
        parse_callback(body)  # stored as posted; the worker parses it again when it takes it
    except ValidationError as exc:
        raise Unprocessable(
            f"the body is neither a step answer {{messages, reward, done, info}} nor a "
            f"failure {{error: {{code, message}}}}: {problems(exc)}",
            field="body",
        ) from None
    replay = Conflict(
        f"a result for episode {episode_id} step {step} was stored already; a step is "
        "answered once",
        field="step",
    )
    if await session.get(EnvCallback, (episode_id, step)) is not None:
        raise replay
    row = EnvCallback(
        episode_id=episode_id, step=step, run_id=run_id, environment_id=env.id, body=body
    )
    try:
        async with session.begin_nested():
            session.add(row)
    except IntegrityError:  # the same step posted twice at once
        raise replay from None
    return row


async def wait_for(
    sessions: async_sessionmaker[AsyncSession],
    relay: CallbackRelay,
    run_id: str,
    episode_id: str,
    step: int,
    *,
    wait_s: float,
    poll_s: float,
) -> dict[str, Any] | None:
    """The stored result (marked delivered), or None after ``wait_s``.

    Each look at the database is its own short transaction, so a long-poll holds
    no connection while it waits. A result fetched twice (the worker lost the
    first answer) is returned again: delivery is at least once.
    """
    if run_id_of(episode_id) != run_id:
        raise NotFound(f"episode {episode_id!r} is not one of run {run_id}", field="episode_id")
    async with sessions() as session:
        if await session.get(Run, run_id) is None:
            raise NotFound(f"no run {run_id!r}", field="run_id")
    deadline = time.monotonic() + wait_s
    with relay.waiting((episode_id, step)) as woken:
        while True:
            woken.clear()
            async with sessions() as session:
                row = await session.get(EnvCallback, (episode_id, step))
                if row is not None:
                    if row.delivered_at is None:
                        row.delivered_at = utcnow()
                        await session.commit()
                    return row.body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(remaining, poll_s))
