"""Worker routes: /internal/runs/{id}/...

The claim is behind a worker's own credential (or the shared worker token, where the
operator keeps it on) and answers a lease token; every other route of a run is behind
that run's current lease token (``LeaseGate``), so a lease token opens the one run its
holder claimed, for as long as its lease lasts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from app.api.deps import (
    LeaseDep,
    LeaseGate,
    ObservabilityDep,
    SessionDep,
    StateDep,
    WorkerIdentityDep,
)
from app.api.jsonbody import documented, json_body
from app.schemas import (
    ClaimBody,
    ClaimRead,
    GatewayBody,
    HeartbeatBody,
    HeartbeatRead,
    IngestRead,
    MetricsBody,
    StatusBody,
    StatusRead,
)
from app.schemas.results import CheckpointRef
from app.services import environments
from app.services import workers as service

claim_router = APIRouter(prefix="/internal/runs", tags=["internal"])
router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[LeaseGate])


@claim_router.post("/{run_id}/claim", response_model=ClaimRead)
async def claim(
    run_id: str,
    body: ClaimBody,
    session: SessionDep,
    app_state: StateDep,
    worker: WorkerIdentityDep,
) -> ClaimRead:
    """The run's spec, its environment's grant (secret included: the claimer is now the
    lease holder) and the lease token that every other route of the run takes.

    With ``fair``, the run taken is the queued run fair order puts first (which may not
    be the one in the path): ``run_id`` in the answer says which."""
    run, lease_token = await service.claim(
        session,
        run_id,
        body.worker_id,
        body.lease_seconds,
        fair=body.fair,
        sandbox=body.sandbox,
        credential=worker,
        bases=body.bases,
        default_accelerator=app_state.routes.default,
    )
    assert run.lease_expires_at is not None
    newest = await service.newest_checkpoint(session, run.id)
    checkpoint = (
        None
        if newest is None
        else CheckpointRef(
            step=newest.step, uri=newest.uri, size_bytes=newest.size_bytes, attempt=newest.attempt
        )
    )
    return ClaimRead(
        run_id=run.id,
        spec=run.spec,
        attempt=run.attempts,
        lease_expires_at=run.lease_expires_at,
        resume_step=run.current_step,
        environment=await environments.grant_for_run(session, run, app_state.secrets),
        scorer=await environments.scorer_grant_for_run(session, run, app_state.secrets),
        judge=await environments.judge_grant_for_run(session, run, app_state.secrets),
        checkpoint=checkpoint,
        lease_token=lease_token,
    )


@router.post("/{run_id}/heartbeat", response_model=HeartbeatRead)
async def heartbeat(
    run_id: str, body: HeartbeatBody, session: SessionDep, lease: LeaseDep
) -> HeartbeatRead:
    inflight = body.inflight.model_dump(mode="json") if body.inflight is not None else None
    run, profile_steps = await service.heartbeat(
        session, run_id, lease, body.worker_id, body.lease_seconds, inflight
    )
    assert run.lease_expires_at is not None
    return HeartbeatRead(
        cancel_requested=run.cancel_requested,
        lease_expires_at=run.lease_expires_at,
        profile_steps=profile_steps,
    )


@router.post("/{run_id}/gateway", response_model=StatusRead)
async def register_gateway(
    run_id: str, body: GatewayBody, session: SessionDep, app_state: StateDep, lease: LeaseDep
) -> StatusRead:
    run = await service.register_gateway(
        session, run_id, lease, body.worker_id, body.url, body.token, app_state.secrets
    )
    return StatusRead(status=run.status)


@router.post("/{run_id}/status", response_model=StatusRead)
async def report_status(
    run_id: str, body: StatusBody, session: SessionDep, lease: LeaseDep
) -> StatusRead:
    run = await service.report_status(
        session, run_id, lease, body.worker_id, body.status, body.error
    )
    return StatusRead(status=run.status)


@router.post("/{run_id}/metrics", response_model=IngestRead, openapi_extra=documented(MetricsBody))
async def ingest_metrics(
    run_id: str,
    body: Annotated[MetricsBody, json_body(MetricsBody)],
    session: SessionDep,
    obs: ObservabilityDep,
    lease: LeaseDep,
) -> IngestRead:
    accepted, duplicate = await service.ingest_metrics(
        session, run_id, lease, body.worker_id, body.seq, body.points, body.updates
    )
    obs.record_ingest("metrics", accepted, duplicate)
    return IngestRead(accepted=accepted, duplicate=duplicate)
