"""The worker's copy of the adapter a run starts from (``model.lora.init_from``).

Behind the run's lease token, as a run's pinned dataset is: the worker of any host fetches
the PEFT export the run pinned at submit (app/services/init_from.py) as a tar.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from app.api.deps import LeaseDep, LeaseGate, SessionDep, StateDep
from app.services import init_from as service

internal_router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[LeaseGate])


@internal_router.get(
    "/{run_id}/init-adapter",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "A tar archive"}},
)
async def download_init_adapter(
    run_id: str, session: SessionDep, app_state: StateDep, lease: LeaseDep
) -> StreamingResponse:
    """The PEFT adapter (adapter_config.json, adapter_model.safetensors) the run starts from."""
    archive = await service.adapter_for_run(session, run_id, lease, settings=app_state.settings)
    return StreamingResponse(
        archive.chunks(),
        media_type="application/x-tar",
        headers={"Content-Length": str(archive.size)},
    )
