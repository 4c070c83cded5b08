"""Public environment routes: /v1/environments. Parse, call one service, render."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import SessionDep, StateDep, TenantDep
from app.errors import Unprocessable
from app.schemas.environments import CheckRead, EnvironmentCreate, EnvironmentPage, EnvironmentRead
from app.services import env_check
from app.services import environments as service
from app.urlcheck import UrlRefused, UrlUnresolvable, pin_url

router = APIRouter(prefix="/v1/environments", tags=["environments"])


@router.post("", status_code=201, response_model=EnvironmentRead)
async def register(
    body: EnvironmentCreate, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> EnvironmentRead:
    env = await service.create(
        session, tenant_id, body, box=app_state.secrets, allowlist=app_state.env_allowlist
    )
    return EnvironmentRead.model_validate(env)


@router.get("", response_model=EnvironmentPage)
async def list_environments(session: SessionDep, tenant_id: TenantDep) -> EnvironmentPage:
    rows = await service.list_for(session, tenant_id)
    return EnvironmentPage(items=[EnvironmentRead.model_validate(e) for e in rows])


@router.get("/{environment_id}", response_model=EnvironmentRead)
async def get_environment(
    environment_id: str, session: SessionDep, tenant_id: TenantDep
) -> EnvironmentRead:
    return EnvironmentRead.model_validate(await service.get(session, tenant_id, environment_id))


@router.delete("/{environment_id}", status_code=204, response_class=Response)
async def delete_environment(
    environment_id: str, session: SessionDep, tenant_id: TenantDep
) -> Response:
    await service.delete(session, tenant_id, environment_id)
    return Response(status_code=204)


@router.post("/{environment_id}/check", response_model=CheckRead)
async def check_environment(
    environment_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> CheckRead:
    """Calls the webhook's /reset then /close once, signed; 200 saying what went wrong."""
    env = await service.get(session, tenant_id, environment_id)
    try:
        # Again now: the name may point somewhere else than when it was registered.
        url, address = await pin_url(env.url, app_state.env_allowlist)
    except UrlUnresolvable as exc:
        return CheckRead(ok=False, error=str(exc), calls=[])
    except UrlRefused as exc:
        raise Unprocessable(str(exc), field="url") from None
    secret = app_state.secrets.decrypt(env.secret_encrypted, context=env.id)
    return await env_check.check(url, secret, env.timeout_s, address=address)
