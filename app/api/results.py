"""Public reads of a run's results: /v1/runs/{id}/timeline, trajectories, checkpoints, ..."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from app.api.deps import SessionDep, StateDep, TenantDep
from app.schemas.results import (
    INT32,
    INT64,
    ArtifactsDeleted,
    CheckpointPage,
    CheckpointRead,
    InflightIn,
    InflightRead,
    LineageRead,
    ProfileCreate,
    ProfileRead,
    TimelineRead,
    TrajectoryPage,
    TrajectoryRead,
)
from app.services import exports as exports_service
from app.services import lineage as lineage_service
from app.services import results as service
from app.services import run_artifacts
from rl_core.artifacts import ExportFormat

router = APIRouter(prefix="/v1/runs", tags=["results"])


@router.get("/{run_id}/timeline", response_model=TimelineRead, response_model_exclude_none=True)
async def get_timeline(
    run_id: str,
    session: SessionDep,
    tenant_id: TenantDep,
    start_us: Annotated[int | None, Query(ge=0, le=INT64)] = None,
    end_us: Annotated[int | None, Query(ge=0, le=INT64)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> dict[str, Any]:
    return await service.timeline(
        session, tenant_id, run_id, start_us=start_us, end_us=end_us, limit=limit
    )


@router.get("/{run_id}/trajectories", response_model=TrajectoryPage)
async def list_trajectories(
    run_id: str,
    session: SessionDep,
    tenant_id: TenantDep,
    step: Annotated[int | None, Query(ge=0, le=INT32)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
) -> TrajectoryPage:
    items, next_cursor = await service.trajectories(
        session, tenant_id, run_id, step=step, cursor=cursor, limit=limit
    )
    return TrajectoryPage(
        items=[TrajectoryRead.model_validate(i) for i in items], next_cursor=next_cursor
    )


@router.get("/{run_id}/checkpoints", response_model=CheckpointPage)
async def list_checkpoints(
    run_id: str, session: SessionDep, tenant_id: TenantDep
) -> CheckpointPage:
    rows = await service.checkpoints(session, tenant_id, run_id)
    return CheckpointPage(
        items=[
            CheckpointRead(
                step=a.step,
                uri=a.uri,
                size_bytes=a.size_bytes,
                attempt=a.attempt,
                created_at=a.created_at,
            )
            for a in rows
        ]
    )


@router.get(
    "/{run_id}/checkpoints/{step}/export",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "A tar archive"}},
)
async def export_checkpoint(
    run_id: str,
    step: Annotated[int, Path(ge=0, le=INT32)],
    session: SessionDep,
    tenant_id: TenantDep,
    app_state: StateDep,
    fmt: Annotated[ExportFormat, Query(alias="format")] = "hf",
) -> StreamingResponse:
    """The checkpoint as a tar of one folder: ``hf``, the model with any LoRA merged
    (config.json, model.safetensors, tokenizer files), or ``peft``, a LoRA run's adapter
    (adapter_config.json, adapter_model.safetensors). docs/exports.md says how to load them."""
    archive = await exports_service.checkpoint_export(
        session, tenant_id, run_id, step, fmt, settings=app_state.settings
    )
    return tar_response(archive)


@router.delete("/{run_id}/artifacts", response_model=ArtifactsDeleted)
async def delete_artifacts(
    run_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> ArtifactsDeleted:
    """Delete a finished run's checkpoints and exports (and TensorBoard files) from
    storage, freeing the tenant's ``artifact_bytes`` quota; the run, its metrics and
    trajectories stay. 409 while the run is live. Download what you keep first."""
    deleted = await run_artifacts.delete_run_artifacts(
        session, tenant_id, run_id, settings=app_state.settings
    )
    return ArtifactsDeleted(
        run_id=deleted.run_id, freed_bytes=deleted.freed_bytes, checkpoints=deleted.checkpoints
    )


@router.get(
    "/{run_id}/trackers/tensorboard",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "A tar archive"}},
)
async def tensorboard_files(
    run_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> StreamingResponse:
    """The run's TensorBoard event files (spec ``trackers: [{kind: tensorboard}]``) as a
    tar of one folder, to open with ``tensorboard --logdir``; a resumed run's attempts
    each add their own file. docs/trackers.md."""
    archive = await exports_service.tensorboard_files(
        session, tenant_id, run_id, settings=app_state.settings
    )
    return tar_response(archive)


@router.get("/{run_id}/lineage", response_model=LineageRead)
async def get_lineage(run_id: str, session: SessionDep, tenant_id: TenantDep) -> dict[str, Any]:
    """Which attempt's update of each step the newest checkpoint holds; ``problems`` names
    any step missing from it or in it twice."""
    return await lineage_service.lineage(session, tenant_id, run_id)


@router.get("/{run_id}/inflight", response_model=InflightRead)
async def get_inflight(run_id: str, session: SessionDep, tenant_id: TenantDep) -> InflightRead:
    run = await service.inflight(session, tenant_id, run_id)
    snapshot = None if run.inflight is None else InflightIn.model_validate(run.inflight)
    return InflightRead(reported_at=run.inflight_at, snapshot=snapshot)


@router.post("/{run_id}/profile", status_code=202, response_model=ProfileRead)
async def request_profile(
    run_id: str, body: ProfileCreate, session: SessionDep, tenant_id: TenantDep
) -> ProfileRead:
    steps = await service.request_profile(session, tenant_id, run_id, body.steps)
    return ProfileRead(requested_steps=steps)


def tar_response(archive: exports_service.Archive) -> StreamingResponse:
    """A tar made on the fly (`app.services.exports.Archive`), its length announced."""
    return StreamingResponse(
        archive.chunks(),
        media_type="application/x-tar",
        headers={
            "Content-Length": str(archive.size),
            "Content-Disposition": f'attachment; filename="{archive.name}"',
        },
    )
