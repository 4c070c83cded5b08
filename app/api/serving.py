"""A run's checkpoint answering chat completions: /v1/runs/{id}/chat/completions.

::

    POST /v1/runs/{id}/chat/completions    tenant key (spends a request, as any /v1 call)
         an OpenAI chat completion request, model "latest" | "step-12" | "12"
         -> OpenAI's answer (model "step-12": the step that answered), or its SSE chunks;
            503 + Retry-After while a worker loads the checkpoint

``OpenAI(base_url=f"{api}/v1/runs/{id}", api_key=tenant_key)`` then calls it. Calls are
proxied to the worker serving the step (`app.services.serving`; the worker's side is
worker/serving.py), which registers itself on the internal routes below with the
secret of its order::

    GET    /internal/serving/{server_id}                           still wanted? (204/404)
    POST   /internal/serving/{server_id}          {"url": ...}     loaded: proxy here
    POST   /internal/serving/{server_id}/failed   {"error": ...}   could not load it
    DELETE /internal/serving/{server_id}                           stopped (idle)
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import StreamingResponse

from app.api.deps import SessionDep, StateDep, TenantDep
from app.dispatch import ServeOrders
from app.errors import Unauthorized, Unavailable
from app.schemas.internal import ServingFailedBody, ServingUrlBody
from app.services import gateways
from app.services import serving as service

router = APIRouter(prefix="/v1/runs", tags=["serving"])
internal_router = APIRouter(prefix="/internal/serving", tags=["internal"])


@router.post("/{run_id}/chat/completions")
async def chat_completions(
    run_id: str, request: Request, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> Any:
    """OpenAI's chat completions, answered by the run's checkpoint that ``model`` names."""
    body = await request.body()
    model = service.requested_model(body)
    found = await service.target(session, tenant_id, run_id, model, app_state.secrets)
    if not isinstance(found, service.Target):
        orders = app_state.serve_orders
        if orders is None:
            raise Unavailable(
                "this deployment serves no checkpoints (its dispatcher sends no serve orders)",
                retry_after_s=60,
                field="model",
            )
        step = int(found["step"])
        await session.commit()  # the row first: the worker registers on it
        await _send(orders, found, app_state.settings.serve_queue)
        raise service.loading(run_id, step)
    await session.commit()  # no transaction held open across the model's answer
    headers = {
        "authorization": f"Bearer {found.token}",
        "content-type": "application/json",
        "accept": request.headers.get("accept", "application/json"),
    }
    try:
        answer, chunks = await gateways.forward(
            app_state.gateways, f"{found.url}/v1/chat/completions", body, headers
        )
    except Unavailable:
        async with app_state.sessions() as fresh:
            await service.dropped(fresh, found.server_id)
            await fresh.commit()
        raise service.loading(run_id, found.step) from None
    passed = gateways.answer_headers(answer)
    if answer.content_type == "text/event-stream":
        return StreamingResponse(chunks, status_code=answer.status, headers=passed)
    return Response(b"".join([c async for c in chunks]), status_code=answer.status, headers=passed)


async def _send(orders: ServeOrders, order: dict[str, Any], queue: str) -> None:
    # Publishing is blocking network I/O (app.dispatch): off the event loop.
    await asyncio.to_thread(orders.serve, order, queue)


def _token(authorization: str | None) -> str:
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("missing Authorization: Bearer <the serving order's token>")
    return value.strip()


@internal_router.get("/{server_id}", status_code=204)
async def wanted(
    server_id: str,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """204 while the API still waits for this server (404: an order replaced or dropped,
    which the worker then does not load)."""
    await service.wanted(session, server_id, _token(authorization), app_state.secrets)
    return Response(status_code=204)


@internal_router.post("/{server_id}", status_code=204)
async def register(
    server_id: str,
    body: ServingUrlBody,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    await service.register(session, server_id, _token(authorization), body.url, app_state.secrets)
    return Response(status_code=204)


@internal_router.post("/{server_id}/failed", status_code=204)
async def failed(
    server_id: str,
    body: ServingFailedBody,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    await service.failed(session, server_id, _token(authorization), body.error, app_state.secrets)
    return Response(status_code=204)


@internal_router.delete("/{server_id}", status_code=204)
async def deregister(
    server_id: str,
    session: SessionDep,
    app_state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    await service.deregister(session, server_id, _token(authorization), app_state.secrets)
    return Response(status_code=204)
