"""Worker routes that store a run's reports: spans, trajectories, artifacts.

Metric points come in through ``app.api.internal``; these sit beside them under
the same prefix, behind the same credential: the run's current lease token.
"""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import LeaseDep, LeaseGate, ObservabilityDep, SessionDep
from app.schemas import IngestRead
from app.schemas.results import ArtifactBody, ArtifactStored, SpansBody, TrajectoriesBody
from app.services import workers as service

router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[LeaseGate])


@router.post("/{run_id}/spans", response_model=IngestRead)
async def ingest_spans(
    run_id: str, body: SpansBody, session: SessionDep, obs: ObservabilityDep, lease: LeaseDep
) -> IngestRead:
    accepted, duplicate = await service.ingest_spans(
        session, run_id, lease, body.worker_id, body.seq, body.spans
    )
    obs.record_ingest("spans", accepted, duplicate)
    return IngestRead(accepted=accepted, duplicate=duplicate)


@router.post("/{run_id}/trajectories", response_model=IngestRead)
async def ingest_trajectories(
    run_id: str,
    body: TrajectoriesBody,
    session: SessionDep,
    obs: ObservabilityDep,
    lease: LeaseDep,
) -> IngestRead:
    accepted, duplicate = await service.ingest_trajectories(
        session, run_id, lease, body.worker_id, body.seq, body.trajectories
    )
    obs.record_ingest("trajectories", accepted, duplicate)
    return IngestRead(accepted=accepted, duplicate=duplicate)


@router.post("/{run_id}/artifacts", response_model=ArtifactStored)
async def record_artifact(
    run_id: str, body: ArtifactBody, session: SessionDep, lease: LeaseDep
) -> ArtifactStored:
    await service.record_artifact(session, run_id, lease, body)
    return ArtifactStored(stored=True)
