"""The lease reaper: a dead worker never strands a run.

A run whose lease expired goes back to the queue after a backoff (and is dispatched
again after the commit), unless its attempts show a crash loop or used up the
deployment's attempt budget; then it fails with the reason (``app.services.crash_loop``
decides). Celery's own redelivery is not relied on: a run outlives any broker
visibility timeout. During the backoff the run keeps its expired lease: a heartbeat
of its worker that comes back (a network blip, not a death) still renews it.

Nor a lost message: a run still ``queued`` ``redispatch_after_s`` after it was
queued (or last sent) is sent again, since the broker may have been down when
it was first sent, or lost the message. A duplicate costs one refused claim:
only a ``queued`` run can be claimed.

Nor a run no worker ever takes: one still ``queued`` ``max_queued_s`` after it entered the
queue (no worker serves the queue, or none is free for that long) is failed with a reason
the tenant can read, and so stops counting against the tenant's runs in flight.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, Run, StepUpdate, utcnow
from app.services import run_states
from app.services.crash_loop import AttemptRecord, Policy, decide

# The reaper driven by hand (tests, tools) queues again at once; the API's loop passes
# the deployment's policy (app.main.reap_once).
NO_BACKOFF = Policy(backoff_s=0.0)


async def attempt_records(session: AsyncSession, run: Run) -> list[AttemptRecord]:
    """Each attempt's furthest trained step and whether it saved a checkpoint."""
    rows = await session.execute(
        select(StepUpdate.attempt, func.max(StepUpdate.step))
        .where(StepUpdate.run_id == run.id)
        .group_by(StepUpdate.attempt)
    )
    trained = {int(attempt): int(step) for attempt, step in rows.all()}
    saved = set(
        await session.scalars(
            select(Artifact.attempt)
            .where(Artifact.run_id == run.id, Artifact.kind == "checkpoint")
            .distinct()
        )
    )
    return [
        AttemptRecord(number=n, trained_to=trained.get(n), saved_checkpoint=n in saved)
        for n in range(1, run.attempts + 1)
    ]


async def reap_expired_leases(
    session: AsyncSession, now: datetime | None = None, *, policy: Policy = NO_BACKOFF
) -> list[str]:
    """Re-queue or fail runs whose lease expired; returns the ids to dispatch again.

    ``policy`` (app.services.crash_loop): a run that advances between preemptions is
    queued again, after a backoff, within the attempt budget; one whose last attempts
    died in a row without progress fails as a crash loop.
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
        verdict = decide(await attempt_records(session, run), policy)
        if not verdict.requeue:
            reason = verdict.reason or "lease expired"
            run_states.transition(session, run, run_states.FAILED, reason=reason, now=now)
            run.error = f"{reason} (last: {lost})"
        elif run.cancel_requested:
            # The owner asked to stop and the worker died: nothing left to resume.
            run_states.transition(session, run, run_states.CANCELLED, reason=lost, now=now)
        elif _naive(run.lease_expires_at) > _naive(now) - timedelta(seconds=verdict.delay_s):
            continue  # still backing off: a later pass queues it
        else:
            run_states.transition(session, run, run_states.QUEUED, reason=lost, now=now)
            requeued.append(run.id)
    await session.flush()
    return requeued


def _naive(moment: datetime | None) -> datetime:
    """UTC without its zone: SQLite reads timestamps back naive, Postgres with a zone."""
    if moment is None:
        return datetime.min
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


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


async def accelerators_of(
    session: AsyncSession, run_ids: list[str]
) -> list[tuple[str, str | None]]:
    """(run id, the accelerator it was admitted to) of each, in the order given: where the
    reaper sends it again (`app.dispatch.dispatch_committed`). None: a run stored before
    runs had one, which goes to the deployment's default."""
    if not run_ids:
        return []
    rows = await session.execute(select(Run.id, Run.accelerator).where(Run.id.in_(run_ids)))
    accelerator = {run_id: acc for run_id, acc in rows.all()}
    return [(run_id, accelerator.get(run_id)) for run_id in run_ids]


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
