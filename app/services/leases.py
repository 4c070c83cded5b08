"""The lease reaper: a dead worker never strands a run.

A run whose lease expired goes back to the queue (and is dispatched again
after the commit), until ``max_attempts`` claims in a row have saved no
checkpoint; then it fails with the reason. Celery's own redelivery is not
relied on: a run outlives any broker visibility timeout.

Nor a lost message: a run still ``queued`` ``redispatch_after_s`` after it was
queued (or last sent) is sent again, since the broker may have been down when
it was first sent, or lost the message. A duplicate costs one refused claim:
only a ``queued`` run can be claimed.

Nor a run no worker ever takes: one still ``queued`` ``max_queued_s`` after it entered the
queue (no worker serves the queue, or none is free for that long) is failed with a reason
the tenant can read, and so stops counting against the tenant's runs in flight.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, Run, utcnow
from app.services import run_states


async def _last_attempt_with_progress(session: AsyncSession, run_id: str) -> int:
    """The last attempt (claim number) that saved a checkpoint; 0 if none did."""
    last = await session.scalar(
        select(func.max(Artifact.attempt)).where(
            Artifact.run_id == run_id, Artifact.kind == "checkpoint"
        )
    )
    return int(last or 0)


async def reap_expired_leases(
    session: AsyncSession, now: datetime | None = None, *, max_attempts: int = 3
) -> list[str]:
    """Re-queue or fail runs whose lease expired; returns the ids to dispatch again.

    ``max_attempts`` bounds the attempts in a row that made no progress (saved no
    checkpoint), not all attempts: a run that advances between preemptions is never
    failed for being preempted often, a run that crashes before its first checkpoint is.
    """
    now = now or utcnow()
    expired = await session.scalars(
        select(Run)
        .where(
            Run.status.in_((run_states.STARTING, run_states.RUNNING)), Run.lease_expires_at < now
        )
        .with_for_update(skip_locked=True)
    )
    requeued: list[str] = []
    for run in expired:
        lost = f"lease held by {run.lease_owner} expired"
        stalled = run.attempts - await _last_attempt_with_progress(session, run.id)
        if stalled >= max_attempts:
            reason = (
                f"lease expired on {stalled} attempts in a row that saved no checkpoint; giving up"
            )
            run_states.transition(session, run, run_states.FAILED, reason=reason, now=now)
            run.error = f"{reason} (last: {lost})"
        elif run.cancel_requested:
            # The owner asked to stop and the worker died: nothing left to resume.
            run_states.transition(session, run, run_states.CANCELLED, reason=lost, now=now)
        else:
            run_states.transition(session, run, run_states.QUEUED, reason=lost, now=now)
            requeued.append(run.id)
    await session.flush()
    return requeued


async def stranded_queued_runs(
    session: AsyncSession, now: datetime | None = None, *, after_s: float
) -> list[str]:
    """Runs queued for longer than ``after_s``: marked as sent now, returned to send."""
    now = now or utcnow()
    stale = await session.scalars(
        select(Run)
        .where(
            Run.status == run_states.QUEUED,
            Run.updated_at < now - timedelta(seconds=after_s),
        )
        .order_by(Run.updated_at)
        .limit(500)
        .with_for_update(skip_locked=True)
    )
    ids = []
    for run in stale:
        run.updated_at = now  # the next pass waits another after_s
        ids.append(run.id)
    await session.flush()
    return ids


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


async def fail_unclaimed_runs(
    session: AsyncSession, now: datetime | None = None, *, after_s: float
) -> list[str]:
    """Fail runs queued for longer than ``after_s`` since they entered the queue (submitted
    or re-queued; a redispatch does not restart the wait); returns their ids. ``after_s``
    of 0 or less turns it off."""
    if after_s <= 0:
        return []
    now = now or utcnow()
    waited_out = await session.scalars(
        select(Run)
        .where(
            Run.status == run_states.QUEUED,
            Run.queued_at < now - timedelta(seconds=after_s),
        )
        .order_by(Run.queued_at)
        .limit(500)
        .with_for_update(skip_locked=True)
    )
    reason = (
        f"no worker took this run in {_span(after_s)} in the queue (the deployment's "
        "limit); its workers may be stopped or all busy. Submit it again later, or ask "
        "the operator whether workers are serving this deployment"
    )
    failed = []
    for run in waited_out:
        run_states.transition(session, run, run_states.FAILED, reason=reason, now=now)
        run.error = reason
        failed.append(run.id)
    await session.flush()
    return failed
