"""Public run routes: /v1/runs. Parse, call one service, render."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from app.api.deps import AfterCommitDep, SessionDep, StateDep, TenantDep
from app.errors import BadRequest
from app.schemas import EventPage, EventRead, MetricsRead, PointRead, RunCreate, RunPage, RunRead
from app.schemas.results import INT32
from app.services import quotas, run_states
from app.services import runs as service

router = APIRouter(prefix="/v1/runs", tags=["runs"])


@router.post(
    "",
    status_code=201,
    response_model=RunRead,
    responses={200: {"model": RunRead, "description": "The run this Idempotency-Key made"}},
)
async def create_run(
    body: RunCreate,
    response: Response,
    session: SessionDep,
    tenant_id: TenantDep,
    after_commit: AfterCommitDep,
    app_state: StateDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> RunRead:
    run, created = await service.create_run(
        session,
        tenant_id,
        body,
        idempotency_key,
        admit=lambda: quotas.admit_run(
            session, tenant_id, app_state.settings, train_steps=body.spec.train.steps
        ),
        routes=app_state.routes,
    )
    if created:
        after_commit.runs.append((run.id, run.accelerator))
    else:
        response.status_code = 200
    return RunRead.model_validate(run)


@router.get("", response_model=RunPage)
async def list_runs(
    session: SessionDep,
    tenant_id: TenantDep,
    status: str | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RunPage:
    if status is not None and status not in run_states.ALL:
        raise BadRequest(f"status must be one of {', '.join(run_states.ALL)}", field="status")
    rows, next_cursor = await service.list_runs(
        session, tenant_id, status=status, cursor=cursor, limit=limit
    )
    return RunPage(items=[RunRead.model_validate(r) for r in rows], next_cursor=next_cursor)


@router.get("/{run_id}", response_model=RunRead)
async def get_run(run_id: str, session: SessionDep, tenant_id: TenantDep) -> RunRead:
    return RunRead.model_validate(await service.get_run(session, tenant_id, run_id))


@router.post("/{run_id}/cancel", response_model=RunRead)
async def cancel_run(run_id: str, session: SessionDep, tenant_id: TenantDep) -> RunRead:
    return RunRead.model_validate(await service.cancel_run(session, tenant_id, run_id))


@router.get("/{run_id}/events", response_model=EventPage)
async def list_events(
    run_id: str,
    session: SessionDep,
    tenant_id: TenantDep,
    after: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
) -> EventPage:
    events = await service.list_events(session, tenant_id, run_id, after=after)
    return EventPage(items=[EventRead.model_validate(e) for e in events])


@router.get("/{run_id}/metrics", response_model=MetricsRead)
async def get_metrics(
    run_id: str,
    session: SessionDep,
    tenant_id: TenantDep,
    name: str | None = None,
    # Steps are stored as 32-bit integers: a larger bound is refused here (422), not
    # passed to Postgres, which fails the query on it (a 500).
    since_step: Annotated[int | None, Query(ge=0, le=INT32)] = None,
    until_step: Annotated[int | None, Query(ge=0, le=INT32)] = None,
) -> MetricsRead:
    points = await service.query_metrics(
        session, tenant_id, run_id, name=name, since_step=since_step, until_step=until_step
    )
    return MetricsRead(
        run_id=run_id, points=[PointRead(step=p.step, name=p.name, value=p.value) for p in points]
    )
