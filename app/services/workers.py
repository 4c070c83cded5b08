"""The worker's side of a run: claim, heartbeat, status reports, metric ingest."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import state
from app.db.models import IngestBatch, MetricPoint, Run, utcnow
from app.errors import Conflict, NotFound
from app.schemas import PointIn


async def _locked_run(session: AsyncSession, run_id: str) -> Run:
    run = await session.scalar(select(Run).where(Run.id == run_id).with_for_update())
    if run is None:
        raise NotFound(f"no run {run_id!r}", field="run_id")
    return run


async def claim(session: AsyncSession, run_id: str, worker_id: str, lease_s: float) -> Run:
    run = await _locked_run(session, run_id)
    if run.status != state.QUEUED:
        raise Conflict(
            f"run {run_id} is {run.status}; only queued runs can be claimed", field="status"
        )
    now = utcnow()
    state.transition(session, run, state.STARTING, reason=f"claimed by {worker_id}", now=now)
    run.attempts += 1
    run.lease_owner = worker_id
    run.lease_expires_at = now + timedelta(seconds=lease_s)
    await session.flush()
    return run


async def _owned_run(session: AsyncSession, run_id: str, worker_id: str) -> Run:
    run = await _locked_run(session, run_id)
    if run.lease_owner != worker_id:
        raise Conflict(
            f"worker {worker_id} does not hold the lease on {run_id} (it is {run.status})",
            field="worker_id",
        )
    return run


async def heartbeat(session: AsyncSession, run_id: str, worker_id: str, lease_s: float) -> Run:
    run = await _owned_run(session, run_id, worker_id)
    run.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
    await session.flush()
    return run


async def report_status(
    session: AsyncSession, run_id: str, worker_id: str, status: str, error: str | None
) -> Run:
    run = await _owned_run(session, run_id, worker_id)
    state.transition(session, run, status, reason=error or f"reported by {worker_id}")
    if error is not None:
        run.error = error
    await session.flush()
    return run


async def ingest_metrics(
    session: AsyncSession, run_id: str, worker_id: str, seq: int, points: Sequence[PointIn]
) -> tuple[int, bool]:
    """Store a batch once per (run, seq); returns (points accepted, was a duplicate)."""
    run = await _owned_run(session, run_id, worker_id)
    seen = await session.get(IngestBatch, (run_id, "metrics", seq))
    if seen is not None:
        return 0, True
    session.add(IngestBatch(run_id=run_id, kind="metrics", seq=seq))
    if points:
        rows = [
            {"run_id": run_id, "name": p.name, "step": p.step, "value": p.value} for p in points
        ]
        insert = pg_insert if session.bind.dialect.name == "postgresql" else sqlite_insert
        stmt = insert(MetricPoint).values(rows)
        # A resumed attempt may report a step again; the newest value wins.
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "name", "step"], set_={"value": stmt.excluded.value}
        )
        await session.execute(stmt)
        run.current_step = max(run.current_step, max(p.step for p in points))
    run.updated_at = utcnow()
    await session.flush()
    return len(points), False


async def count_points(session: AsyncSession, run_id: str) -> int:
    return int(
        await session.scalar(
            select(func.count()).select_from(MetricPoint).where(MetricPoint.run_id == run_id)
        )
        or 0
    )
