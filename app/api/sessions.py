"""Sessions of a ``sessions`` run, through the API: /v1/runs/{id}/sessions[/{sid}/...].

::

    POST /v1/runs/{id}/sessions                      tenant key   {"group": "task-17"}
         -> 201 {"session_id", "base_url", "api_key", "group"}
    POST /v1/runs/{id}/sessions/{sid}/chat/completions   session key (the openai client)
    POST /v1/runs/{id}/sessions/{sid}/completions        session key (legacy text completions)
    POST /v1/runs/{id}/sessions/{sid}/responses          session key (the Responses API)
    POST /v1/runs/{id}/sessions/{sid}/end                session key  {"reward", ...}
    POST /v1/runs/{id}/sessions/{sid}/cancel             session key

``base_url`` is this API's (``OpenAI(base_url=..., api_key=...)`` then calls the
routes below it). One base URL for many sessions, with the tenant's key, each call
naming its session (``X-Session-ID: <name>`` or ``model: "session:<name>"``; opened on
its first call, in the group ``X-Session-Group``; docs/sessions.md)::

    POST /v1/runs/{id}/openai/chat/completions | /completions | /responses   tenant key
    POST /v1/runs/{id}/openai/sessions/{name}/end | /cancel                  tenant key
 Each call is proxied to the gateway of the worker holding the run
(`app.services.gateways`); answers, errors (OpenAI's body) and SSE streams come back
as the gateway sent them.
"""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession

from app.api.deps import AppState, SessionCallTenantDep, SessionDep, StateDep, TenantDep
from app.errors import AppError, NotFound, Unavailable
from app.observability import Observability
from app.services import gateways, session_ends

router = APIRouter(prefix="/v1/runs", tags=["sessions"])

# A session's calls, each proxied as it came (the routes below).
ACTIONS = ("chat/completions", "completions", "responses", "end", "cancel")


@router.post("/{run_id}/sessions", status_code=201)
async def open_session(
    run_id: str, request: Request, session: SessionDep, tenant_id: TenantDep, app_state: StateDep
) -> Response:
    gateway = await gateways.gateway_of(session, run_id, app_state.secrets, tenant_id)
    await session.commit()  # no transaction held open across the worker's answer
    headers = {"authorization": f"Bearer {gateway.token}", "content-type": "application/json"}
    answer, chunks = await gateways.forward(
        app_state.gateways, f"{gateway.url}/v1/sessions", await request.body(), headers
    )
    body = b"".join([c async for c in chunks])
    if answer.status == 201:
        body = _with_our_base_url(body, f"{str(request.base_url).rstrip('/')}/v1/runs/{run_id}")
    return Response(body, status_code=answer.status, headers=gateways.answer_headers(answer))


async def _proxy(run_id: str, sid: str, action: str, request: Request, app_state: AppState) -> Any:
    """One call of a session, passed to the run's gateway as it came (the session key is
    the gateway's to check). The gateway's URL comes from a short cache, one database
    read per run when it expires (bench S1: the read was most of what the proxy added
    to a call, and at 64 sessions, all of them reading at once, its p99)."""

    async def load() -> gateways.Gateway:
        try:
            async with app_state.sessions() as session:
                return await gateways.gateway_of(session, run_id, app_state.secrets)
        except AppError as exc:
            # No key of the API opens these routes (the session's key is the gateway's to
            # check), so whether a run exists, and of what kind, is told to no one here.
            raise NotFound(
                f"no open session {sid!r} of run {run_id}: the run does not serve sessions "
                "now (not a sessions run, not started, ended, or restarting). Open a new "
                "session",
                field="sid",
            ) from exc

    try:
        gateway = await app_state.gateway_cache.lookup(run_id, load)
    except NotFound:
        await _if_gone(run_id, sid, request, app_state)
        raise
    await _spend_request(gateway, sid, request, app_state)
    try:
        answer, chunks = await gateways.forward(
            app_state.gateways,
            f"{gateway.url}/v1/sessions/{sid}/{action}",
            await request.body(),
            request.headers,
        )
    except Unavailable as exc:
        app_state.gateway_cache.drop(run_id)  # the run may have moved: look it up again
        await _if_gone(run_id, sid, request, app_state)
        raise NotFound(
            f"no open session {sid!r} of run {run_id}: its worker did not answer (it may "
            "be restarting; sessions do not outlive it). Open a new session",
            field="sid",
        ) from exc
    headers = gateways.answer_headers(answer)
    if answer.content_type == "text/event-stream":
        return StreamingResponse(chunks, status_code=answer.status, headers=headers)
    body = b"".join([c async for c in chunks])
    if answer.status == 404:  # a session the gateway does not know: maybe the last attempt's
        await _if_gone(run_id, sid, request, app_state)
    return Response(body, status_code=answer.status, headers=headers)


async def _spend_request(
    gateway: gateways.Gateway, sid: str, request: Request, app_state: AppState
) -> None:
    """A session's call spends a request of its run's tenant, from the bucket their /v1
    calls spend (429 past it, with Retry-After, which the openai client obeys), so that
    a tenant's agents cannot call past the rate the operator set by opening sessions.
    Only a call carrying the session's key spends: any other is the gateway's to refuse,
    and nobody can spend a tenant's budget without one of its keys."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    expected = session_ends.session_key(gateway.token, sid)
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        expected.encode(), key.strip().encode()
    ):
        return
    async with app_state.sessions() as session:
        await app_state.limits.take_session_call(session, gateway.tenant_id)


async def _if_gone(run_id: str, sid: str, request: Request, app_state: AppState) -> None:
    """410 to the holder of the session's key once the session is gone for good (its run
    ended, or the attempt serving it was replaced: `session_ends.session_gone`); to anyone
    else the 404 that follows."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        return
    async with app_state.sessions() as session:
        gone = await session_ends.session_gone(session, run_id, sid, key.strip(), app_state.secrets)
    if isinstance(gone, session_ends.SessionLost):
        observability: Observability = request.app.state.observability
        observability.sessions_lost.inc()
    if gone is not None:
        raise gone


@router.post("/{run_id}/sessions/{sid}/chat/completions")
async def chat_completions(run_id: str, sid: str, request: Request, app_state: StateDep) -> Any:
    """OpenAI's chat completions; ``Authorization: Bearer <the session's api_key>``."""
    return await _proxy(run_id, sid, "chat/completions", request, app_state)


@router.post("/{run_id}/sessions/{sid}/completions")
async def completions(run_id: str, sid: str, request: Request, app_state: StateDep) -> Any:
    """OpenAI's legacy (text) completions; ``Authorization: Bearer <the session's api_key>``."""
    return await _proxy(run_id, sid, "completions", request, app_state)


@router.post("/{run_id}/sessions/{sid}/responses")
async def responses(run_id: str, sid: str, request: Request, app_state: StateDep) -> Any:
    """OpenAI's Responses API; ``Authorization: Bearer <the session's api_key>``."""
    return await _proxy(run_id, sid, "responses", request, app_state)


@router.post("/{run_id}/sessions/{sid}/end")
async def end_session(run_id: str, sid: str, request: Request, app_state: StateDep) -> Any:
    """``{"reward": r, "turn_rewards": [...]}``; ``Authorization: Bearer <api_key>``."""
    return await _proxy(run_id, sid, "end", request, app_state)


@router.post("/{run_id}/sessions/{sid}/cancel")
async def cancel_session(run_id: str, sid: str, request: Request, app_state: StateDep) -> Any:
    """End the session unscored; ``Authorization: Bearer <api_key>``."""
    return await _proxy(run_id, sid, "cancel", request, app_state)


def _with_our_base_url(body: bytes, runs_base: str) -> bytes:
    data = json.loads(body)
    data["base_url"] = f"{runs_base}/sessions/{data['session_id']}"
    return json.dumps(data).encode()


# --- one base URL for many sessions: the tenant's key, the session named per call ------


async def _shared(
    run_id: str,
    path: str,
    request: Request,
    session: AsyncSession,
    tenant_id: str,
    app_state: AppState,
) -> Any:
    """A call on the run's shared URL, passed to its gateway's (``/v1/openai/...``) with
    the run's gateway token: the tenant's key proved the run is theirs, and the gateway
    finds (or opens) the session the call names."""
    gateway = await gateways.gateway_of(session, run_id, app_state.secrets, tenant_id)
    await session.commit()  # no transaction held open across the model's answer
    headers = {**request.headers, "authorization": f"Bearer {gateway.token}"}
    try:
        answer, chunks = await gateways.forward(
            app_state.gateways, f"{gateway.url}/v1/openai/{path}", await request.body(), headers
        )
    except Unavailable:
        app_state.gateway_cache.drop(run_id)
        raise
    passed = gateways.answer_headers(answer)
    if answer.content_type == "text/event-stream":
        return StreamingResponse(chunks, status_code=answer.status, headers=passed)
    body = b"".join([c async for c in chunks])
    return Response(body, status_code=answer.status, headers=passed)


@router.post("/{run_id}/openai/chat/completions")
async def shared_chat_completions(
    run_id: str,
    request: Request,
    session: SessionDep,
    tenant_id: SessionCallTenantDep,
    app_state: StateDep,
) -> Any:
    """Chat completions for the session named by ``X-Session-ID`` (or ``model:
    "session:<name>"``), opened on its first call; ``Authorization: Bearer <tenant key>``."""
    return await _shared(run_id, "chat/completions", request, session, tenant_id, app_state)


@router.post("/{run_id}/openai/completions")
async def shared_completions(
    run_id: str,
    request: Request,
    session: SessionDep,
    tenant_id: SessionCallTenantDep,
    app_state: StateDep,
) -> Any:
    """Legacy text completions for the named session (as ``/openai/chat/completions``)."""
    return await _shared(run_id, "completions", request, session, tenant_id, app_state)


@router.post("/{run_id}/openai/responses")
async def shared_responses(
    run_id: str,
    request: Request,
    session: SessionDep,
    tenant_id: SessionCallTenantDep,
    app_state: StateDep,
) -> Any:
    """The Responses API for the named session (as ``/openai/chat/completions``)."""
    return await _shared(run_id, "responses", request, session, tenant_id, app_state)


@router.post("/{run_id}/openai/sessions/{name}/end")
async def shared_end(
    run_id: str,
    name: str,
    request: Request,
    session: SessionDep,
    tenant_id: SessionCallTenantDep,
    app_state: StateDep,
) -> Any:
    """End the session named ``name`` with ``{"reward": r, "turn_rewards": [...]}``."""
    path = f"sessions/{quote(name, safe='')}/end"
    return await _shared(run_id, path, request, session, tenant_id, app_state)


@router.post("/{run_id}/openai/sessions/{name}/cancel")
async def shared_cancel(
    run_id: str,
    name: str,
    request: Request,
    session: SessionDep,
    tenant_id: SessionCallTenantDep,
    app_state: StateDep,
) -> Any:
    """End the session named ``name`` unscored."""
    path = f"sessions/{quote(name, safe='')}/cancel"
    return await _shared(run_id, path, request, session, tenant_id, app_state)
