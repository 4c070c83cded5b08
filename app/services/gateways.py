"""Sessions runs through the API: client calls proxied to the gateway of the run's worker.

The worker holding a ``sessions`` run serves its gateway (worker/gateway.py) and
registers its URL and token (``POST /internal/runs/{id}/gateway``). Clients talk to
the API only: opening a session needs the tenant's key, and the API opens it on the
gateway with the run's token; the session's own calls carry the session key, which
the gateway checks. The API checks it too, only to know whose requests a call spends
(a session key is an HMAC of the run's token, `session_ends.session_key`), and keeps
it no longer than the request that carries it. Why a proxy and not the worker's
URL handed to clients: docs/sessions.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import NamedTuple

import aiohttp
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Run
from app.errors import Conflict, NotFound, Unavailable
from app.services import run_states
from rl_core.spec import SESSIONS

CACHE_S = 2.0  # how long a run's gateway is used without reading the database again

# What is passed between client and gateway; hop-by-hop and length headers are not.
# X-Session-*: a call on the run's shared URL names its session (worker/named_sessions.py).
PASSED_HEADERS = (
    "authorization",
    "content-type",
    "accept",
    "x-session-id",
    "x-session-group",
    "x-session-wait",
)
ANSWER_HEADERS = ("content-type", "cache-control", "retry-after")


class Gateway(NamedTuple):
    """Where a run's sessions are served, the token that opens them, and whose run it is
    (a session's calls spend that tenant's requests, as its /v1 calls do)."""

    url: str
    token: str
    tenant_id: str


async def gateway_of(
    session: AsyncSession, run_id: str, box: SecretBox, tenant_id: str | None = None
) -> Gateway:
    """The run's gateway; ``tenant_id`` when the caller must own the run."""
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
    return Gateway(run.gateway_url, token, run.tenant_id)


class GatewayCache:
    """Each run's gateway for `CACHE_S`: a session's calls skip the database read (the
    cost measured by bench S1). An entry is dropped when its gateway does not answer,
    so a run moved to another worker is looked up again at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, tuple[Gateway, float]] = {}
        self._clock = clock
        self._loading: dict[str, asyncio.Future[Gateway]] = {}

    async def lookup(self, run_id: str, load: Callable[[], Awaitable[Gateway]]) -> Gateway:
        """The cached gateway, or ``load()``'s, put in the cache. Calls that miss together
        share one ``load`` (S1 at 64 sessions: every entry's expiry sent each of the calls
        in flight to the database at once, and their wait for a connection was the p99)."""
        cached = self.get(run_id)
        if cached is not None:
            return cached
        loading = self._loading.get(run_id)
        if loading is not None:
            try:
                return await asyncio.shield(loading)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if loading.cancelled() and task is not None and not task.cancelling():
                    return await self.lookup(run_id, load)  # the loader's caller went away
                raise
        loading = self._loading[run_id] = asyncio.get_running_loop().create_future()
        try:
            gateway = await load()
        except Exception as exc:
            loading.set_exception(exc)
            loading.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        except BaseException:
            loading.cancel()
            raise
        else:
            self.put(run_id, gateway)
            loading.set_result(gateway)
            return gateway
        finally:
            del self._loading[run_id]

    def get(self, run_id: str) -> Gateway | None:
        entry = self._entries.get(run_id)
        if entry is None or entry[1] < self._clock():
            return None
        return entry[0]

    def put(self, run_id: str, gateway: Gateway) -> None:
        if len(self._entries) > 10_000:  # bounded: expired ones go first
            now = self._clock()
            self._entries = {k: v for k, v in self._entries.items() if v[1] >= now}
        self._entries[run_id] = (gateway, self._clock() + CACHE_S)

    def drop(self, run_id: str) -> None:
        self._entries.pop(run_id, None)


def client_session() -> aiohttp.ClientSession:
    """The proxy's client: aiohttp, whose pool costs ~0.4 ms of CPU a call where httpx's
    cost 13-21 ms under load (bench B13); a model call may wait minutes, connecting not."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=900.0),
        auto_decompress=False,
    )


async def forward(
    client: aiohttp.ClientSession | None,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
) -> tuple[aiohttp.ClientResponse, AsyncIterator[bytes]]:
    """POST ``body`` to ``url``; the answer's head now and its body as it comes (SSE)."""
    assert client is not None, "the app's lifespan makes the gateways' client"
    passed = {k: v for k, v in headers.items() if k.lower() in PASSED_HEADERS}
    try:
        answer = await client.post(url, data=body, headers=passed, allow_redirects=False)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unavailable(
            "the run's worker did not answer (it may be restarting, or the run moved to "
            f"another worker): {type(exc).__name__}. Retry",
            retry_after_s=2,
        ) from exc

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in answer.content.iter_any():
                yield chunk
        finally:
            answer.release()

    return answer, chunks()


def answer_headers(answer: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.lower() in ANSWER_HEADERS}


__all__ = ["Gateway", "GatewayCache", "answer_headers", "client_session", "forward", "gateway_of"]
