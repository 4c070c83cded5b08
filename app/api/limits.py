"""GET /v1/limits: the caller's quotas and how much of them is in use, what a run's
``resources`` may ask of the deployment (app.routing), and the Tinker-compatible API's limits
(app.services.tinker_limits)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep, StateDep, TenantDep
from app.routing import Routes
from app.schemas.limits import (
    AcceleratorRead,
    LimitsRead,
    QuotasRead,
    ResourcesRead,
    TinkerLimitsRead,
    TinkerQuotasRead,
    TinkerUsageRead,
    UsageRead,
)
from app.services.budget import run_seconds_used
from app.services.datasets import bytes_used as datasets_bytes
from app.services.quotas import Quotas, artifact_bytes_used, runs_in_flight
from app.services.tinker_limits import calls_in_flight, models_per_base, tokens_available

router = APIRouter(prefix="/v1/limits", tags=["limits"])


@router.get("", response_model=LimitsRead)
async def get_limits(session: SessionDep, tenant_id: TenantDep, app_state: StateDep) -> LimitsRead:
    quotas = await app_state.limits.quotas(session, tenant_id)
    period = app_state.settings.quota_run_seconds_period_s
    used, _ = await run_seconds_used(session, tenant_id, period)
    return LimitsRead(
        quotas=QuotasRead(
            runs_in_flight=quotas.runs_in_flight,
            requests_per_minute=quotas.requests_per_minute,
            body_bytes=quotas.body_bytes,
            run_seconds=quotas.run_seconds,
            run_seconds_period_s=period,
            train_steps=quotas.train_steps,
            dataset_bytes=quotas.dataset_bytes,
            artifact_bytes=quotas.artifact_bytes,
        ),
        usage=UsageRead(
            runs_in_flight=await runs_in_flight(session, tenant_id),
            requests_available=await app_state.limits.requests_available(tenant_id, quotas),
            run_seconds=round(used),
            dataset_bytes=await datasets_bytes(session, tenant_id),
            artifact_bytes=await artifact_bytes_used(session, tenant_id),
        ),
        resources=_resources(app_state.routes),
        tinker=await _tinker(session, tenant_id, app_state, quotas),
    )


def _resources(routes: Routes) -> ResourcesRead:
    # Queue names are the operator's business: a tenant needs the accelerators only.
    return ResourcesRead(
        accelerators=[
            AcceleratorRead(
                accelerator=o.accelerator,
                max_hosts=o.max_hosts,
                max_rollout_servers=o.max_rollout_servers,
            )
            for o in routes.offers
        ],
        default_accelerator=routes.default,
    )


async def _tinker(
    session: SessionDep, tenant_id: str, app_state: StateDep, quotas: Quotas
) -> TinkerLimitsRead:
    """The tenant's own Tinker limits where the operator set them, else the deployment's;
    0 (no limit) reads as null."""
    per_minute = quotas.tinker_tokens_per_minute
    return TinkerLimitsRead(
        quotas=TinkerQuotasRead(
            models_per_base=quotas.tinker_models_per_base or None,
            calls_in_flight=quotas.tinker_calls_in_flight or None,
            tokens_per_minute=per_minute or None,
        ),
        usage=TinkerUsageRead(
            models=await models_per_base(session, app_state.settings, tenant_id),
            calls_in_flight=await calls_in_flight(session, tenant_id),
            tokens_available=await tokens_available(app_state.limits, tenant_id, per_minute),
        ),
    )
