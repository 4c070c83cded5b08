"""The HTTP client under `WebhookEnvironment`: one POST, its answer, and nothing else.

`WebhookEnvironment` owns the protocol (signing, retries, deadlines, the
breaker); a `Transport` only sends bytes and brings back an `Answer`. The
default is aiohttp: at 256 requests in flight httpx/httpcore spent most of the
worker's event loop on its pool (httpcore 1.0.9 scans every pooled connection
for every request, httpcore#1035), while aiohttp's connector hands out an idle
connection from a per-host list (bench/b13_webhook_call.py measures both).

Where it may connect is checked as it connects (server-side request forgery):
aiohttp resolves an environment's host name through `CheckingResolver`, which
refuses the connection unless every address the name resolves to is allowed by
the `Allowlist` (``RLAAS_ENV_URL_ALLOWLIST``, `rl_core.protocol.addresses`),
and aiohttp then connects to exactly those addresses, with the URL's name in
the Host header and as TLS SNI. An IP-literal URL never reaches a resolver, so
`AiohttpTransport.post` checks it itself. So a name re-pointed after it was
registered, or one that rebinds between the control plane's check and the
connection, cannot reach metadata, link-local or (on a server) private
addresses. Redirects are never followed. A refusal is `AddressRefused`, which
`WebhookEnvironment` does not retry.

An answer is read up to `MAX_ANSWER_BYTES`; a longer one is `AnswerTooLarge`, before
it is all in memory. A failure says what kind it was (`TransportError.kind`): no
connection, a connection reset or closed under the request, or a broken answer; the
first two are how an overloaded server sheds load, which `WebhookEnvironment` answers
by sending fewer requests at once (`rl_core.envs.adaptive`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
import ssl
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Literal, Protocol

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from rl_core.protocol.addresses import Allowlist, ip_literal, parse_address


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, read in full. ``headers`` look up case-insensitively."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


# An answer of the protocol is a few kilobytes; a callback may carry 1 MiB. Far more is a
# server gone wrong, and the worker must not hold it in memory for every episode in flight.
MAX_ANSWER_BYTES = 8 * 1024 * 1024

FailureKind = Literal["connect", "reset", "broken", "too_large"]


class TransportError(Exception):
    """No answer: the connection failed or broke, or the answer was not HTTP.

    The message names the kind (``ClientConnectorError: ...``) and reaches the tenant.
    ``kind``: ``connect`` (no connection: refused, unreachable), ``reset`` (the connection
    was reset or closed before the answer began), ``broken`` (anything else: TLS refused,
    an answer cut short or not HTTP), ``too_large`` (`AnswerTooLarge`).
    """

    def __init__(self, message: str, kind: FailureKind = "broken") -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


class AnswerTooLarge(TransportError):
    """The answer is longer than the transport reads (`MAX_ANSWER_BYTES`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "too_large")


class AddressRefused(TransportError):
    """No connection was tried: the host is, or resolves to, an address the allowlist does
    not allow. A policy refusal, not a network error: retrying cannot help.

    The message names the host, the address and the rule, and reaches the tenant.
    """


class CheckingResolver(AbstractResolver):
    """aiohttp's resolver, refusing any host name that is not allowed or that resolves to
    an address that is not (`AddressRefused`); what it returns is what aiohttp connects
    to. Answers are checked before aiohttp's DNS cache keeps them, so a cached answer
    is a checked one."""

    def __init__(self, allowlist: Allowlist, inner: AbstractResolver | None = None) -> None:
        self.allowlist = allowlist
        # aiohttp's own default (threaded getaddrinfo, or aiodns when installed).
        self._inner = inner if inner is not None else aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        why = self.allowlist.host_refusal(host)  # a metadata name is never looked up
        if why is None:
            found = await self._inner.resolve(host, port, family)
            why = self.allowlist.refusal(host, [parse_address(r["host"]) for r in found])
            if why is None:
                return found
        raise AddressRefused(f"refused to connect: {why}")

    async def close(self) -> None:
        await self._inner.close()


class Transport(Protocol):
    """One per event loop. ``post`` raises `TimeoutError` when the whole answer has not
    arrived within ``timeout_s``, `TransportError` for any other failure to get one."""

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer: ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[int], Transport]  # (max connections) -> a transport


class AiohttpTransport:
    """aiohttp's `ClientSession`, its pool sized to the environment's ``max_concurrency``,
    connecting only where ``allowlist`` allows (`CheckingResolver`; ``resolver`` is the
    DNS under it, aiohttp's default unless given).

    Made inside the event loop it will serve.
    """

    def __init__(
        self,
        max_connections: int,
        *,
        allowlist: Allowlist,
        resolver: AbstractResolver | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.allowlist = allowlist
        self.max_answer_bytes = max_answer_bytes
        # aiohttp closes only a resolver it made itself: this one is closed with the session.
        self._resolver = CheckingResolver(allowlist, resolver)
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            resolver=self._resolver,
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
        self._guard = _closing(self._session, self._resolver)
        self._guarded = False

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        if not self._guarded:
            self._guarded = True
            await anext(self._guard)  # its first step registers it with the running loop
        why = _literal_refusal(self.allowlist, url)
        if why is not None:
            raise AddressRefused(f"refused to connect: {why}")
        try:
            # One timer for the whole exchange, connect to the last body byte (httpx's
            # float timeout applied to each phase apart).
            async with (
                asyncio.timeout(timeout_s),
                self._session.post(url, data=body, headers=headers, allow_redirects=False) as r,
            ):
                content = await _read_capped(r, self.max_answer_bytes, url)
                return Answer(r.status, r.reason or "", r.headers, content)
        except TimeoutError:
            raise
        except aiohttp.ClientSSLError as exc:  # a bad certificate is not a busy server
            raise TransportError(f"{type(exc).__name__}: {exc}", "broken") from exc
        except aiohttp.ClientConnectorError as exc:  # before ClientOSError: a subclass
            raise TransportError(f"{type(exc).__name__}: {exc}", "connect") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}", "reset") from exc
        except aiohttp.ClientError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}", "broken") from exc

    async def aclose(self) -> None:
        await self._guard.aclose()  # its ``finally`` closes the session, if it started
        await self._session.close()
        await self._resolver.close()


async def _read_capped(response: aiohttp.ClientResponse, cap: int, url: str) -> bytes:
    """The body, or `AnswerTooLarge` as soon as it is known to be over ``cap`` bytes."""
    declared = response.content_length
    if declared is not None and declared > cap:
        raise AnswerTooLarge(f"the answer of {url} declares {declared} bytes, over {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > cap:
            raise AnswerTooLarge(f"the answer of {url} runs over {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@functools.lru_cache(maxsize=256)  # an environment calls three URLs, thousands of times
def _literal_refusal(allowlist: Allowlist, url: str) -> str | None:
    """Why ``url`` may not be called, when its host is an IP literal, which aiohttp
    connects to without asking a resolver; None for a name (`CheckingResolver` checks it)
    or an allowed address."""
    host = URL(url).raw_host or ""
    literal = ip_literal(host)
    return None if literal is None else allowlist.refusal(host, [literal])


async def _closing(
    session: aiohttp.ClientSession, resolver: AbstractResolver
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await session.close()
        await resolver.close()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per process, verifying against certifi's CA bundle (building one
    loads the bundle, ~0.3 s)."""
    return ssl.create_default_context(cafile=certifi.where())


__all__ = [
    "MAX_ANSWER_BYTES",
    "AddressRefused",
    "AiohttpTransport",
    "Answer",
    "AnswerTooLarge",
    "CheckingResolver",
    "FailureKind",
    "Transport",
    "TransportError",
    "TransportFactory",
]
