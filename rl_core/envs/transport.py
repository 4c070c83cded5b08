"""The HTTP client under `WebhookEnvironment`: one POST, its answer, and nothing else.

`WebhookEnvironment` owns the protocol (signing, retries, deadlines, the
breaker); a `Transport` only sends bytes and brings back an `Answer`. The
default is aiohttp: at 256 requests in flight httpx/httpcore spent most of the
worker's event loop on its pool (httpcore 1.0.9 scans every pooled connection
for every request, httpcore#1035), while aiohttp's connector hands out an idle
connection from a per-host list (bench/b13_webhook_call.py measures both).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Protocol

import aiohttp
import certifi


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, read in full. ``headers`` look up case-insensitively."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class TransportError(Exception):
    """No answer: the connection failed or broke, or the answer was not HTTP.

    The message names the kind (``ClientConnectorError: ...``) and reaches the tenant.
    """


class Transport(Protocol):
    """One per event loop. ``post`` raises `TimeoutError` when the whole answer has not
    arrived within ``timeout_s``, `TransportError` for any other failure to get one."""

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer: ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[int], Transport]  # (max connections) -> a transport


class AiohttpTransport:
    """aiohttp's `ClientSession`, its pool sized to the environment's ``max_concurrency``.

    Made inside the event loop it will serve.
    """

    def __init__(self, max_connections: int) -> None:
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            ssl=tls_context(),
            # Idle connections are dropped before the 5 s after which uvicorn and Node close
            # theirs, so a request is not sent down a connection the server is closing
            # (the race docs/vllm.md describes; httpx kept them 5 s).
            keepalive_timeout=4.0,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            # No cookies: an environment's answers must not change the next request.
            cookie_jar=aiohttp.DummyCookieJar(),
            # No session-wide timers: each call brings its own deadline (`post`).
            timeout=aiohttp.ClientTimeout(total=None),
            # A proxy set for the worker's own traffic must not see environment calls.
            trust_env=False,
        )
        # Ties the session to the loop's life: asyncio closes a loop's open async generators
        # before the loop itself (`asyncio.run` does, in ``shutdown_asyncgens``), so a
        # transport whose owner never calls `aclose` still closes its connections in the
        # loop that opened them, instead of "Unclosed client session" errors when the
        # garbage collector finds it after the loop is gone.
        self._guard = _closing(self._session)
        self._guarded = False

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        if not self._guarded:
            self._guarded = True
            await anext(self._guard)  # its first step registers it with the running loop
        try:
            # One timer for the whole exchange, connect to the last body byte (httpx's
            # float timeout applied to each phase apart).
            async with (
                asyncio.timeout(timeout_s),
                self._session.post(url, data=body, headers=headers, allow_redirects=False) as r,
            ):
                content = await r.read()
                return Answer(r.status, r.reason or "", r.headers, content)
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._guard.aclose()  # its ``finally`` closes the session, if it started
        await self._session.close()


async def _closing(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await session.close()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per process, verifying against certifi's CA bundle (building one
    loads the bundle, ~0.3 s)."""
    return ssl.create_default_context(cafile=certifi.where())


__all__ = ["AiohttpTransport", "Answer", "Transport", "TransportError", "TransportFactory"]
