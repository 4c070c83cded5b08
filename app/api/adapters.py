"""Public adapter routes: /v1/adapters. Parse, call one service, render.

The upload's body is a tar of a PEFT adapter folder (``application/x-tar``), streamed to
the service chunk by chunk, never read whole.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from app.api.deps import SessionDep, StateDep, TenantDep
from app.schemas.adapters import AdapterPage, AdapterRead
from app.services import adapters as service

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "description": (
            "A tar holding adapter_config.json and adapter_model.safetensors, as PEFT saves "
            "them (or as GET /v1/runs/{id}/checkpoints/{step}/export?format=peft answers)."
        ),
        "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "",
    status_code=201,
    response_model=AdapterRead,
    openapi_extra=_UPLOAD_DOC,
    responses={
        413: {"description": "Over RLAAS_ADAPTER_MAX_BYTES"},
        422: {"description": "Not a tar of a PEFT LoRA adapter; the message says what is off"},
    },
)
async def upload(
    request: Request,
    session: SessionDep,
    tenant_id: TenantDep,
    app_state: StateDep,
    name: Annotated[str, Query(min_length=1, max_length=200, pattern=_NAME)],
) -> AdapterRead:
    """Upload a PEFT LoRA adapter to start runs from (``model.lora.init_from: adapter:<id>``).
    Each upload is a new adapter; none is ever replaced."""
    adapter = await service.upload(
        session, tenant_id, name, request.stream(), settings=app_state.settings
    )
    return AdapterRead.model_validate(adapter)


@router.get("", response_model=AdapterPage)
async def list_adapters(session: SessionDep, tenant_id: TenantDep) -> AdapterPage:
    rows = await service.list_for(session, tenant_id)
    return AdapterPage(items=[AdapterRead.model_validate(a) for a in rows])


@router.get("/{adapter_id}", response_model=AdapterRead)
async def get_adapter(adapter_id: str, session: SessionDep, tenant_id: TenantDep) -> AdapterRead:
    return AdapterRead.model_validate(await service.get(session, tenant_id, adapter_id))


@router.delete("/{adapter_id}", status_code=204, response_class=Response)
async def delete_adapter(
    adapter_id: str, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> Response:
    """Refused (409, naming them) while a queued or running run starts from it."""
    await service.delete(session, tenant_id, adapter_id, settings=app_state.settings)
    return Response(status_code=204)
