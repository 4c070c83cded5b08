"""Deferred environment results: posted by the environment, long-polled by the worker.

``POST /v1/env-callbacks/{episode_id}/{step}`` carries no API key: the
environment's signature (``X-Rlaas-Signature``) over a body that names the
step is its credential, checked against the secret of the environment the
episode's run uses. Having no tenant to charge, its rate is per source address.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response

from app.api.deps import LeaseDep, LeaseGate, StateDep
from app.schemas.environments import CallbackAccepted
from app.schemas.internal import CallbackRead
from app.services import callbacks as service

router = APIRouter(prefix="/v1/env-callbacks", tags=["environments"])
internal_router = APIRouter(prefix="/internal/runs", tags=["internal"], dependencies=[LeaseGate])

StepPath = Annotated[int, Path(ge=0, le=2**31 - 1)]


@router.post("/{episode_id}/{step}", status_code=202, response_model=CallbackAccepted)
async def post_callback(
    episode_id: str,
    step: StepPath,
    request: Request,
    app_state: StateDep,
    x_rlaas_signature: Annotated[str | None, Header()] = None,
) -> CallbackAccepted:
    """No SessionDep: a post for a step not awaited yet is held for the worker's poll, and
    holds no database session meanwhile (each look is its own transaction in the service)."""
    app_state.limits.take_callback(request.client.host if request.client else None)
    raw = await request.body()  # the MAC is over the exact bytes, so no JSON model here
    await service.accept(
        app_state.sessions,
        app_state.relay,
        episode_id,
        step,
        raw,
        x_rlaas_signature,
        app_state.secrets,
        hold_s=app_state.settings.callback_await_grace_s,
        poll_s=app_state.settings.callback_poll_s,
    )
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
    lease: LeaseDep,
    wait_s: Annotated[float, Query(ge=0, le=60)] = 25.0,
) -> CallbackRead | Response:
    """Long-poll: 200 with the stored result (marked delivered), 204 if none came in wait_s.

    While it polls, the step is awaited: a result posted for it is taken.

    It holds no database session while waiting (no SessionDep): each look is its own
    short transaction inside the service.
    """
    body = await service.wait_for(
        app_state.sessions,
        app_state.relay,
        run_id,
        lease,
        episode_id,
        step,
        wait_s=wait_s,
        poll_s=app_state.settings.callback_poll_s,
        grace_s=app_state.settings.callback_await_grace_s,
    )
    if body is None:
        return Response(status_code=204)
    return CallbackRead(body=body)
