"""Workers' reports of themselves: the sandbox wall each runs tenant code behind.

A worker reports at start-up (``POST /internal/workers/report``) and with every claim;
``/readyz`` lists the last report of each, so an operator sees which workers refuse
tenant code (no bubblewrap) and which run it behind a weak wall they accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import WorkerReport, utcnow
from app.schemas.internal import SandboxIn

# The newest reports /readyz lists (a deployment's workers, not its history).
LISTED = 100


async def record(
    session: AsyncSession, worker_id: str, sandbox: SandboxIn, queue: str | None = None
) -> None:
    """Upsert the worker's row (two API processes may record the same worker at once)."""
    values = {
        "worker_id": worker_id,
        "sandbox_wall": sandbox.wall,
        "tenant_code": sandbox.tenant_code,
        "reported_at": utcnow(),
    }
    if queue is not None:
        values["queue"] = queue
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(WorkerReport).values(values)
    changed = {k: v for k, v in values.items() if k != "worker_id"}
    await session.execute(insert.on_conflict_do_update(index_elements=["worker_id"], set_=changed))


async def newest(session: AsyncSession) -> Sequence[WorkerReport]:
    query = select(WorkerReport).order_by(WorkerReport.reported_at.desc()).limit(LISTED)
    return (await session.scalars(query)).all()


def wall_note(sandbox: SandboxIn | None) -> str:
    """The claim event's words about the claimer's wall ("" from a worker that sent none)."""
    if sandbox is None:
        return ""
    if sandbox.tenant_code == "runs_on_weak_wall":
        return (
            f" (sandbox wall: WEAK, {sandbox.wall} only: not a wall between tenants; "
            "accepted by its operator or the embedded single-user default)"
        )
    if sandbox.tenant_code == "refused":
        return f" (sandbox wall: {sandbox.wall} only, so it refuses tenant code)"
    return f" (sandbox wall: {sandbox.wall})"
