"""Sessions runs through the API: client calls proxied to the gateway of the run's worker.

The worker holding a ``sessions`` run serves its gateway (worker/gateway.py) and
registers its URL and token (``POST /internal/runs/{id}/gateway``). Clients talk to
the API only: opening a session needs the tenant's key, and the API opens it on the
gateway with the run's token; the session's own calls carry the session key, which
the API passes through unread (the gateway checks it), so the API never sees a
session's key outside the request that carries it. Why a proxy and not the worker's
URL handed to clients: docs/sessions.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Run
from app.errors import Conflict, NotFound, Unavailable
from app.services import run_states
from rl_core.spec import SESSIONS

# What is passed between client and gateway; hop-by-hop and length headers are not.
PASSED_HEADERS = ("authorization", "content-type", "accept")
ANSWER_HEADERS = ("content-type", "cache-control", "retry-after")


async def gateway_of(
    session: AsyncSession, run_id: str, box: SecretBox, tenant_id: str | None = None
) -> tuple[str, str]:
    """(URL, token) of the run's gateway; ``tenant_id`` when the caller must own the run."""
    query = select(Run).where(Run.id == run_id)
    if tenant_id is not None:
        query = query.where(Run.tenant_id == tenant_id)
    run = await session.scalar(query)
    if run is None:
        raise NotFound(f"no run {run_id}", field="run_id")
    if (run.spec.get("environment") or {}).get("name") != SESSIONS:
        raise Conflict(
            f"run {run_id} plays its own environment; sessions are for runs whose "
            "environment.name is 'sessions'",
            field="run_id",
        )
    if run.status in run_states.TERMINAL:
        raise Conflict(f"run {run_id} is {run.status}: it takes no more sessions", field="status")
    if run.gateway_url is None or run.gateway_token_encrypted is None:
        raise Unavailable(
            f"run {run_id} is {run.status}; its worker has not started serving sessions yet",
            retry_after_s=2,
        )
    token = box.decrypt(run.gateway_token_encrypted, context=f"gateway:{run.id}")
    return run.gateway_url, token


async def forward(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    """POST ``body`` to ``url``; the answer's head now and its body as it comes (SSE)."""
    request = client.build_request(
        "POST",
        url,
        content=body,
        headers={k: v for k, v in headers.items() if k.lower() in PASSED_HEADERS},
    )
    try:
        answer = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise Unavailable(
            "the run's worker did not answer (it may be restarting, or the run moved to "
            f"another worker): {type(exc).__name__}. Retry",
            retry_after_s=2,
        ) from exc

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            await answer.aclose()

    return answer, chunks()


def answer_headers(answer: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.lower() in ANSWER_HEADERS}


__all__ = ["answer_headers", "forward", "gateway_of"]
