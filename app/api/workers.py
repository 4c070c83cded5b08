"""POST /internal/workers/report: a worker says which sandbox wall it runs tenant code
behind (at start-up; each claim says it again). Behind the worker's credential, as the
claim is. ``/readyz`` lists the reports (app/api/health.py)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep, WorkerDep
from app.schemas.internal import StatusRead, WorkerReportBody
from app.services import worker_reports

router = APIRouter(prefix="/internal/workers", tags=["internal"], dependencies=[WorkerDep])


@router.post("/report", response_model=StatusRead)
async def report(body: WorkerReportBody, session: SessionDep) -> StatusRead:
    await worker_reports.record(session, body.worker_id, body.sandbox, queue=body.queue)
    return StatusRead(status="reported")
