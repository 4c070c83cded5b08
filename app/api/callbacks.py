"""Deferred environment results: posted by the environment, long-polled by the worker.

``POST /v1/env-callbacks/{episode_id}/{step}`` carries no API key: the
environment's signature (``X-Rlaas-Signature``) is its credential, checked
against the secret of the environment the episode's run uses.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Header, Path, Query, Request, Response

from app.api.deps import SessionDep, StateDep, WorkerDep
from app.schemas.environments import CallbackAccepted
from app.schemas.internal import CallbackRead
from app.services import callbacks as service

router = APIRouter(prefix="/v1/env-callbacks", tags=["environments"])
internal_router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[WorkerDep])

StepPath = Annotated[int, Path(ge=0, le=2**31 - 1)]


@router.post("/{episode_id}/{step}", status_code=202, response_model=CallbackAccepted)
async def post_callback(
    episode_id: str,
    step: StepPath,
    request: Request,
    session: SessionDep,
    app_state: StateDep,
    background: BackgroundTasks,
    x_rlaas_signature: Annotated[str | None, Header()] = None,
) -> CallbackAccepted:
    raw = await request.body()  # the MAC is over the exact bytes, so no JSON model here
    await service.accept(session, episode_id, step, raw, x_rlaas_signature, app_state.secrets)
    # Background tasks run after the response, i.e. after the commit: a woken poll finds the row.
    background.add_task(app_state.relay.notify, (episode_id, step))
    return CallbackAccepted(accepted=True)


@internal_router.get(
    "/{run_id}/env-callbacks/{episode_id}/{step}",
    response_model=CallbackRead,
    responses={204: {"description": "No result yet; ask again"}},
)
async def wait_for_callback(
    run_id: str,
    episode_id: str,
    step: StepPath,
    app_state: StateDep,
    wait_s: Annotated[float, Query(ge=0, le=60)] = 25.0,
) -> CallbackRead | Response:
    """Long-poll: 200 with the stored result (marked delivered), 204 if none came in wait_s.

    It holds no database session while waiting (no SessionDep): each look is its own
    short transaction inside the service.
    """
    body = await service.wait_for(
        app_state.sessions,
        app_state.relay,
        run_id,
        episode_id,
        step,
        wait_s=wait_s,
        poll_s=app_state.settings.callback_poll_s,
    )
    if body is None:
        return Response(status_code=204)
    return CallbackRead(body=body)
