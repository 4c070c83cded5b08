"""API keys of the caller's tenant: /v1/keys. List, create, revoke (rotation is the three).

A revoked key is refused by this API process at once; other processes may still accept
it for up to 10 seconds (their `KnownKeys` window).
"""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SessionDep, StateDep, TenantDep
from app.schemas.keys import KeyCreated, KeyPage, KeyRead
from app.services import tenants

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.get("", response_model=KeyPage)
async def list_keys(session: SessionDep, tenant_id: TenantDep) -> KeyPage:
    rows = await tenants.list_keys(session, tenant_id)
    return KeyPage(items=[KeyRead.model_validate(r) for r in rows])


@router.post("", status_code=201, response_model=KeyCreated)
async def create_key(session: SessionDep, tenant_id: TenantDep) -> KeyCreated:
    row, key = await tenants.create_key(session, tenant_id)
    return KeyCreated(**KeyRead.model_validate(row).model_dump(), key=key)


@router.delete("/{key_id}", response_model=KeyRead)
async def revoke_key(
    key_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> KeyRead:
    row = await tenants.revoke_key(session, tenant_id, key_id)
    app_state.known_keys.forget_tenant(tenant_id)
    return KeyRead.model_validate(row)
