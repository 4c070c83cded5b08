"""The compute budget: run-seconds a tenant's runs may hold workers for in a rolling period,
and the most ``train.steps`` one run may ask for.

A run-second is a second a run is ``starting`` or ``running``: a worker is held for it,
whatever the worker does. It is read from ``run_events``, the runs' complete history, so
it needs no counter of its own and counts a re-queued run's attempts and not its waits.
The period is rolling (the last ``RLAAS_QUOTA_RUN_SECONDS_PERIOD_S``, a day), so no clock
time frees every tenant's budget at once.

The budget is checked when a run is submitted, never by stopping one: a run admitted
under the budget runs to its end, and its seconds count against the next submits. So a
tenant can go over by what its runs in flight use; the cap on ``train.steps`` bounds what
one run can ask for.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, RunEvent, utcnow
from app.services import run_states

_HOLDING = (run_states.STARTING, run_states.RUNNING)

Interval = tuple[datetime, datetime]


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)  # SQLite drops the zone


async def held_intervals(
    session: AsyncSession, tenant_id: str, since: datetime, now: datetime
) -> list[Interval]:
    """When the tenant's runs held a worker, clipped to [since, now]."""
    rows = await session.execute(
        select(RunEvent.run_id, RunEvent.to_status, RunEvent.created_at)
        .join(Run, Run.id == RunEvent.run_id)
        .where(
            Run.tenant_id == tenant_id,
            Run.attempts > 0,  # claimed at least once: never-claimed runs used nothing
            or_(Run.finished_at.is_(None), Run.finished_at > since),
        )
        .order_by(RunEvent.run_id, RunEvent.id)
    )
    intervals: list[Interval] = []
    run_id, opened = None, None

    def close(at: datetime) -> None:
        if opened is not None and at > since:
            start, end = max(opened, since), min(at, now)
            if end > start:
                intervals.append((start, end))

    for row_run, to_status, at in rows:
        at = _aware(at)
        if row_run != run_id:
            close(now)  # the previous run still holds a worker
            run_id, opened = row_run, None
        if to_status in _HOLDING:
            opened = opened or at
        else:
            close(at)
            opened = None
    close(now)
    return intervals


def seconds_in(intervals: list[Interval], since: datetime) -> float:
    return sum((end - max(start, since)).total_seconds() for start, end in intervals if end > since)


def seconds_until_under(
    intervals: list[Interval], budget_s: float, period_s: float, now: datetime
) -> int:
    """How long until the use in the rolling period falls under ``budget_s``, if the runs
    going now stopped now (they may not: then the next submit is told again)."""
    low, high = 0.0, period_s  # after a whole period nothing is left in it
    for _ in range(40):  # halving: well under a second's precision
        mid = (low + high) / 2
        since = now - timedelta(seconds=period_s - mid)
        if seconds_in(intervals, since) < budget_s:
            high = mid
        else:
            low = mid
    return max(1, math.ceil(high))


async def run_seconds_used(
    session: AsyncSession, tenant_id: str, period_s: float, now: datetime | None = None
) -> tuple[float, list[Interval]]:
    """The tenant's run-seconds in the rolling period ending ``now``, and their intervals."""
    now = now or utcnow()
    since = now - timedelta(seconds=period_s)
    intervals = await held_intervals(session, tenant_id, since, now)
    return seconds_in(intervals, since), intervals
