"""The run state machine: the one place a run's status changes.

::

    queued ──▶ starting ──▶ running ──▶ succeeded | failed | cancelled
      │  ▲         │           │
      │  └─────────┴───────────┘   lease expired: back to the queue (reaper)
      └──▶ cancelled | failed      (failed: no worker took it in time; starting also
                                    ──▶ failed | cancelled)

Every transition writes a ``run_events`` row, so the event log is complete by
construction.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, RunEvent, utcnow
from app.errors import Conflict

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ALL = (QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)

ALLOWED: dict[str, frozenset[str]] = {
    # queued -> failed: the reaper, when no worker took the run within RLAAS_MAX_QUEUED_S.
    QUEUED: frozenset({STARTING, CANCELLED, FAILED}),
    STARTING: frozenset({RUNNING, QUEUED, FAILED, CANCELLED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, QUEUED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    return target in ALLOWED.get(current, frozenset())


def transition(
    session: AsyncSession,
    run: Run,
    target: str,
    *,
    reason: str | None = None,
    now: datetime | None = None,
) -> None:
    """Move ``run`` to ``target`` or raise Conflict naming its current state."""
    if not can_transition(run.status, target):
        raise Conflict(f"run {run.id} is {run.status}; it cannot become {target}", field="status")
    now = now or utcnow()
    session.add(
        RunEvent(
            run_id=run.id, from_status=run.status, to_status=target, reason=reason, created_at=now
        )
    )
    run.status = target
    run.updated_at = now
    if target == RUNNING and run.started_at is None:
        run.started_at = now
    if target in TERMINAL:
        run.finished_at = now
        run.lease_owner = None
        run.lease_expires_at = None
        run.lease_token_hash = None
    if target == QUEUED:
        run.queued_at = now
        run.lease_owner = None
        run.lease_expires_at = None
        run.lease_token_hash = None


def record_creation(session: AsyncSession, run: Run) -> None:
    session.add(
        RunEvent(
            run_id=run.id,
            from_status=None,
            to_status=run.status,
            reason="submitted",
            created_at=run.created_at,
        )
    )
