"""Worker credentials: issued, listed and revoked by the operator; checked at each claim.

Each worker holds its own (``rlaas workers issue NAME``), so a leaked one is revoked
without touching the other workers. It opens what the shared worker token opened, the
claim and the worker's report (``/internal/runs/{id}/claim``, ``/internal/workers/report``);
a run's other routes take the lease token its claim answered (app.security).

Nothing is cached: a credential is looked up on each call that carries it (a claim per
run, a report per worker start), so a revocation holds from the next call on, in every
API process. Revoking also ends the leases its claims hold (their lease tokens stop at
once; the reaper queues the runs again), since whoever holds a leaked credential may
hold the lease tokens of the runs it claimed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Run, WorkerCredential, utcnow
from app.errors import NotFound, Unauthorized, Unprocessable
from app.security import hash_key, new_worker_credential, parse_worker_prefix, same_secret
from app.services import run_states

log = logging.getLogger("rlaas.api")

# last_used_at moves at most this often per credential: a write a minute, not one per call.
TOUCH_EVERY_S = 60.0
HOW_TO_ENROL = (
    "each worker enrols with its own credential: the operator runs `rlaas workers issue "
    "NAME` and sets what it prints as RLAAS_WORKER_CREDENTIAL on that worker"
)


@dataclass(frozen=True)
class WorkerIdentity:
    """Who made a worker call: an enrolled credential, or the shared token (no id)."""

    credential_id: str | None
    name: str
    stale: bool = False  # its last_used_at is older than TOUCH_EVERY_S

    def describe(self) -> str:
        if self.credential_id is None:
            return "the shared worker token"
        return f"worker credential {self.credential_id} ({self.name})"


SHARED = WorkerIdentity(credential_id=None, name="shared")


async def issue(session: AsyncSession, name: str) -> tuple[WorkerCredential, str]:
    """A new credential; returns (its row, the plaintext: shown once, never stored)."""
    name = name.strip()
    if not name or len(name) > 200:
        raise Unprocessable(
            "a worker credential's name is 1 to 200 characters: name the worker (its host)",
            field="name",
        )
    credential, prefix, digest = new_worker_credential()
    row = WorkerCredential(
        id=f"wcr_{uuid.uuid4().hex}",
        name=name,
        prefix=prefix,
        secret_hash=digest,
        created_at=utcnow(),
    )
    session.add(row)
    await session.flush()
    return row, credential


async def list_credentials(session: AsyncSession) -> list[WorkerCredential]:
    rows = await session.scalars(
        select(WorkerCredential).order_by(WorkerCredential.created_at, WorkerCredential.id)
    )
    return list(rows)


async def revoke(session: AsyncSession, credential_id: str) -> tuple[WorkerCredential, list[str]]:
    """Revoke a credential and end the leases its claims hold; returns (row, those runs).

    Revoking again changes nothing. A run whose lease ends here is queued again by the
    reaper's next pass, as one whose worker died (its newest checkpoint resumes it).
    """
    row = await session.scalar(
        select(WorkerCredential).where(WorkerCredential.id == credential_id).with_for_update()
    )
    if row is None:
        raise NotFound(
            f"no worker credential {credential_id!r}; `rlaas workers list` shows their ids",
            field="credential_id",
        )
    now = utcnow()
    if row.revoked_at is None:
        row.revoked_at = now
    ended = await session.scalars(
        update(Run)
        .where(
            Run.lease_credential_id == row.id,
            Run.status.in_((run_states.STARTING, run_states.RUNNING)),
        )
        .values(lease_token_hash=None, lease_expires_at=now)
        .returning(Run.id)
    )
    run_ids = list(ended)
    await session.flush()
    return row, run_ids


async def authenticate(session: AsyncSession, credential: str) -> WorkerIdentity:
    """The enrolled, unrevoked credential ``credential`` is, or Unauthorized saying why."""
    prefix = parse_worker_prefix(credential)
    row = None
    if prefix is not None:
        row = await session.scalar(
            select(WorkerCredential).where(WorkerCredential.prefix == prefix)
        )
    # Hash and compare even when no row matched, so timing tells nothing.
    expected = row.secret_hash if row is not None else "0" * 64
    if not same_secret(hash_key(credential), expected) or row is None:
        raise Unauthorized(
            "not a worker credential of this control plane (nor the shared worker token, "
            f"where that is allowed: RLAAS_ALLOW_SHARED_WORKER_TOKEN); {HOW_TO_ENROL}",
            field="Authorization",
        )
    if row.revoked_at is not None:
        raise _revoked(row.id, row.name, row.revoked_at)
    return WorkerIdentity(credential_id=row.id, name=row.name, stale=_stale(row.last_used_at))


async def hold(session: AsyncSession, identity: WorkerIdentity) -> None:
    """Share-lock the credential's row until the request commits, and refuse it if it was
    revoked meanwhile: a revoke (which locks the row for update) waits for a claim in
    flight, and then ends the lease that claim took, so no claim slips past a revocation.
    After ``touch``, which writes the row in a transaction of its own."""
    if identity.credential_id is None:
        return
    revoked_at = await session.scalar(
        select(WorkerCredential.revoked_at)
        .where(WorkerCredential.id == identity.credential_id)
        .with_for_update(read=True)
    )
    if revoked_at is not None:
        raise _revoked(identity.credential_id, identity.name, revoked_at)


def _revoked(credential_id: str, name: str, revoked_at: datetime) -> Unauthorized:
    return Unauthorized(
        f"worker credential {credential_id} ({name}) was revoked at "
        f"{revoked_at.isoformat()}; issue this worker a new one (`rlaas workers issue "
        f"{name}`) and set it as RLAAS_WORKER_CREDENTIAL",
        field="Authorization",
    )


def _stale(last_used_at: datetime | None) -> bool:
    if last_used_at is None:
        return True
    if last_used_at.tzinfo is None:  # SQLite reads timestamps back naive (UTC)
        last_used_at = last_used_at.replace(tzinfo=utcnow().tzinfo)
    return utcnow() - last_used_at > timedelta(seconds=TOUCH_EVERY_S)


async def touch(sessions: async_sessionmaker[AsyncSession], identity: WorkerIdentity) -> None:
    """Move the credential's last_used_at, in a transaction of its own: a call refused
    later (a claim that finds nothing queued) still counts as a use."""
    if identity.credential_id is None or not identity.stale:
        return
    now = utcnow()
    async with sessions() as session:
        await session.execute(
            update(WorkerCredential)
            .where(
                WorkerCredential.id == identity.credential_id,
                or_(
                    WorkerCredential.last_used_at.is_(None),
                    WorkerCredential.last_used_at < now - timedelta(seconds=TOUCH_EVERY_S),
                ),
            )
            .values(last_used_at=now)
        )
        await session.commit()


@dataclass
class SharedTokenNotice:
    """The shared token's deprecation warning: at its first use in this process, then at
    most once per ``every_s`` with the count of uses since (never one line per call)."""

    every_s: float = 3600.0
    clock: Callable[[], float] = time.monotonic
    _next_at: float | None = field(default=None, init=False)
    _unlogged: int = field(default=0, init=False)

    def used(self) -> None:
        self._unlogged += 1
        now = self.clock()
        if self._next_at is not None and now < self._next_at:
            return
        log.warning(
            "a worker used the shared worker token (RLAAS_WORKER_TOKEN; %d uses since the "
            "last warning): it is deprecated, and every worker that holds it can claim any "
            "queued run and receive its environment secret; %s, then turn the shared token "
            "off (RLAAS_ALLOW_SHARED_WORKER_TOKEN=0)",
            self._unlogged,
            HOW_TO_ENROL,
        )
        self._unlogged = 0
        self._next_at = now + self.every_s
