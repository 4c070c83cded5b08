"""The session gateway: a ``sessions`` run's policy behind an OpenAI-compatible URL.

An aiohttp server on the run's own event loop, over its
`rl_core.sessions.broker.SessionBroker` (rl_core has no web code; this is its edge)::

    POST /v1/sessions                          Authorization: Bearer <run token>
         {"group": "task-17", "wait_s": 10}    -> 201 {"session_id", "base_url", "api_key"}
         (both optional; wait_s: how long to wait for a free episode before the 429)
    POST /v1/sessions/{id}/chat/completions    Authorization: Bearer <session key>
         an OpenAI chat completion request     -> the answer, or its SSE chunks
    POST /v1/sessions/{id}/completions         Authorization: Bearer <session key>
         a legacy (text) completion request    -> the answer, or its SSE chunks
    POST /v1/sessions/{id}/end                 Authorization: Bearer <session key>
         {"reward": 1.0, "turn_rewards": [...]} -> 200 {"session_id", "calls", "prefix_breaks"}
    POST /v1/sessions/{id}/cancel              Authorization: Bearer <session key>
                                               -> 200: ended unscored, never trained on

``base_url`` and ``api_key`` are what the official client takes:
``OpenAI(base_url=base_url, api_key=api_key)``. The run token opens sessions; a
session key opens only its own session. Every error is OpenAI's error body with a
status (429 with Retry-After when the run has no free episode: its backpressure).

Served by ``rlaas train`` for a local run (`serve_gateway`), and in a deployment by
the worker that holds the run, behind the API's proxy (`app.api.sessions`;
docs/sessions.md says why).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeGuard

from aiohttp import web

from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    ChatCompletionRequest,
    parse_request,
    stream_completion,
)
from rl_core.protocol.chat_completions.request import StreamOptions
from rl_core.protocol.completions import parse_completion_request, stream_text_completion
from rl_core.protocol.responses import parse_responses_request, stream_response
from rl_core.sessions.broker import NoRoom, SessionBroker
from worker.named_sessions import NamedSessions, session_name

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024  # a long conversation with tool results, not a file upload
MAX_OPEN_WAIT_S = 60  # a long poll for a free episode; the client asks again after
SHARED = "/v1/openai"  # the shared base URL's path: OpenAI(base_url=f"{url}/v1/openai")
ROUTES: web.AppKey[_Routes] = web.AppKey("routes")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Call = Callable[[web.Request, str, str, bytes], Awaitable[web.StreamResponse]]
GROUP_HEADER = "X-Session-Group"  # the GRPO group of a session named on the shared URL
WAIT_HEADER = "X-Session-Wait"  # seconds its first call may wait for a free episode


def gateway_app(broker: SessionBroker, *, token: str, public_url: str) -> web.Application:
    """The routes above; ``public_url`` is the base clients reach this server at."""
    # Session keys signed with the run's token: the control plane, which keeps the token,
    # can then tell a session's key after this server is gone (app.services.session_ends).
    broker.sign_keys(token)
    routes = _Routes(broker, token=token, public_url=public_url.rstrip("/"))
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app[ROUTES] = routes
    app.router.add_post("/v1/sessions", routes.open)
    app.router.add_post("/v1/sessions/{sid}/chat/completions", routes.complete)
    app.router.add_post("/v1/sessions/{sid}/completions", routes.complete_text)
    app.router.add_post("/v1/sessions/{sid}/responses", routes.respond)
    app.router.add_post("/v1/sessions/{sid}/end", routes.end)
    app.router.add_post("/v1/sessions/{sid}/cancel", routes.cancel)
    # One base URL for many sessions, named per request (worker/named_sessions.py).
    app.router.add_post(f"{SHARED}/chat/completions", routes.shared(routes.chat_call))
    app.router.add_post(f"{SHARED}/completions", routes.shared(routes.text_call))
    app.router.add_post(f"{SHARED}/responses", routes.shared(routes.responses_call))
    app.router.add_post(f"{SHARED}/sessions/{{name}}/end", routes.end_named)
    app.router.add_post(f"{SHARED}/sessions/{{name}}/cancel", routes.cancel_named)
    return app


@contextlib.asynccontextmanager
async def serve_gateway(
    broker: SessionBroker,
    *,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    public_url: str | None = None,
) -> AsyncIterator[str]:
    """Serve ``broker`` on ``host:port`` (0: a free port) until the block ends; yields the
    URL clients use (``public_url`` when it is set, e.g. behind a proxy)."""
    # The routes read the public URL at request time: the port is known only once bound.
    app = gateway_app(broker, token=token, public_url="")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]  # the port the system chose for 0
    url = (public_url or f"http://{host}:{bound}").rstrip("/")
    app[ROUTES].public_url = url
    try:
        yield url
    finally:
        await runner.cleanup()


class _Routes:
    def __init__(self, broker: SessionBroker, *, token: str, public_url: str) -> None:
        self.broker, self.token, self.public_url = broker, token, public_url
        self.named = NamedSessions(broker)

    def _check_run_token(self, request: web.Request) -> None:
        if not hmac.compare_digest(_bearer(request).encode(), self.token.encode()):
            raise ChatCompletionError(
                "this route needs the run's gateway token (Authorization: Bearer <token>); "
                "rlaas train prints it and writes it to sessions.json in --out",
                code="invalid_api_key",
                status=401,
                type="authentication_error",
            )

    async def open(self, request: web.Request) -> web.Response:
        self._check_run_token(request)
        body = await _json(request, optional=True)
        group = body.get("group")
        if group is not None and (not isinstance(group, str) or not 0 < len(group) <= 200):
            raise ChatCompletionError(
                "group must be a string of 1 to 200 characters (e.g. your task's id)",
                param="group",
            )
        wait_s = body.get("wait_s", 0)
        if not _finite(wait_s) or not 0 <= wait_s <= MAX_OPEN_WAIT_S:
            raise ChatCompletionError(
                f"wait_s must be a number of seconds from 0 to {MAX_OPEN_WAIT_S} (how long "
                "to wait for a free episode before the 429)",
                param="wait_s",
            )
        session = await self.broker.open(group, wait_s=float(wait_s))
        answer = {
            "session_id": session.session_id,
            "base_url": f"{self.public_url}/v1/sessions/{session.session_id}",
            "api_key": session.key,
            "group": group,
        }
        return web.json_response(answer, status=201)

    # -- a session's own URL: /v1/sessions/{sid}/..., with the session's key ------------

    async def complete(self, request: web.Request) -> web.StreamResponse:
        sid, key = request.match_info["sid"], _bearer(request)
        self.broker.session(sid, key)  # 404 before reading a body meant for nobody
        return await self.chat_call(request, sid, key, await request.read())

    async def complete_text(self, request: web.Request) -> web.StreamResponse:
        sid, key = request.match_info["sid"], _bearer(request)
        self.broker.session(sid, key)
        return await self.text_call(request, sid, key, await request.read())

    async def respond(self, request: web.Request) -> web.StreamResponse:
        sid, key = request.match_info["sid"], _bearer(request)
        self.broker.session(sid, key)
        return await self.responses_call(request, sid, key, await request.read())

    async def end(self, request: web.Request) -> web.Response:
        sid, key = request.match_info["sid"], _bearer(request)
        self.broker.session(sid, key)
        return await self._end(sid, key, await _json(request))

    async def cancel(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        self.broker.cancel(sid, _bearer(request))
        return web.json_response({"session_id": sid, "cancelled": True})

    # -- the calls, whichever URL named the session --------------------------------------

    async def chat_call(
        self, request: web.Request, sid: str, key: str, raw: bytes
    ) -> web.StreamResponse:
        parsed = parse_request(raw)
        answer = await self.broker.complete(sid, key, parsed)
        if not parsed.stream:
            return web.Response(text=answer.to_json(), content_type="application/json")
        events = stream_completion(answer, include_usage=_with_usage(parsed.stream_options))
        return await _event_stream(request, events)

    async def text_call(
        self, request: web.Request, sid: str, key: str, raw: bytes
    ) -> web.StreamResponse:
        parsed = parse_completion_request(raw)
        answer = await self.broker.complete_text(sid, key, parsed)
        if not parsed.stream:
            return web.Response(text=answer.to_json(), content_type="application/json")
        events = stream_text_completion(answer, include_usage=_with_usage(parsed.stream_options))
        return await _event_stream(request, events)

    async def responses_call(
        self, request: web.Request, sid: str, key: str, raw: bytes
    ) -> web.StreamResponse:
        """A Responses API call: translated onto the session's chat call, through the
        broker (its checks and timeline), and kept for ``previous_response_id``."""
        session = self.broker.session(sid, key)
        parsed = parse_responses_request(raw)

        async def complete(chat: ChatCompletionRequest) -> ChatCompletion:
            return await self.broker.complete(sid, key, chat)

        answer = await session.chat.responses.respond(parsed, complete)
        if not parsed.stream:
            return web.Response(text=answer.to_json(), content_type="application/json")
        return await _event_stream(request, stream_response(answer))

    async def _end(self, sid: str, key: str, body: dict[str, Any]) -> web.Response:
        session = self.broker.session(sid, key)
        reward = body.get("reward")
        if not _finite(reward):
            raise ChatCompletionError("reward must be a finite number", param="reward")
        turn_rewards = body.get("turn_rewards")
        if turn_rewards is not None and not (
            isinstance(turn_rewards, list) and all(_finite(x) for x in turn_rewards)
        ):
            raise ChatCompletionError(
                "turn_rewards must be a list of finite numbers, one per call",
                param="turn_rewards",
            )
        ledger = session.chat.ledger
        self.broker.end(sid, key, float(reward), turn_rewards)
        answer = {
            "session_id": sid,
            "calls": len(ledger.calls),
            "prefix_breaks": len(ledger.breaks),
        }
        return web.json_response(answer)

    # -- the shared URL: /v1/openai/..., with the run's token, sessions named ------------

    def shared(self, call: _Call) -> Handler:
        """``call`` for the session the request names, opened on its first call."""

        async def handler(request: web.Request) -> web.StreamResponse:
            self._check_run_token(request)
            raw = await request.read()
            name = session_name(request.headers, raw)
            group = request.headers.get(GROUP_HEADER)
            sid, key = await self.named.resolve(name, group, wait_s=_open_wait(request))
            return await call(request, sid, key, raw)

        return handler

    async def end_named(self, request: web.Request) -> web.Response:
        self._check_run_token(request)
        sid, key = self.named.lookup(request.match_info["name"])
        answer = await self._end(sid, key, await _json(request))
        return answer

    async def cancel_named(self, request: web.Request) -> web.Response:
        self._check_run_token(request)
        sid, key = self.named.lookup(request.match_info["name"])
        self.broker.cancel(sid, key)
        return web.json_response({"session_id": sid, "cancelled": True})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as OpenAI's error body; what is not a refusal is logged, and the
    client reads a reason without this server's internals."""
    try:
        return await handler(request)
    except ChatCompletionError as exc:
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, NoRoom) else None
        return web.json_response(exc.body(), status=exc.status, headers=headers)
    except web.HTTPException as exc:  # aiohttp's own: unknown route, body too large
        error = ChatCompletionError(exc.reason or "refused", status=exc.status)
        return web.json_response(error.body(), status=exc.status)
    except Exception:
        log.exception("session gateway: %s %s failed", request.method, request.path)
        error = ChatCompletionError(
            "the server failed to answer this call; it is logged. Retry, or end the session",
            status=500,
            type="server_error",
        )
        return web.json_response(error.body(), status=500)


def _open_wait(request: web.Request) -> float:
    raw = request.headers.get(WAIT_HEADER)
    if raw is None:
        return float(MAX_OPEN_WAIT_S)
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = math.nan
    if not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_OPEN_WAIT_S:
        raise ChatCompletionError(
            f"{WAIT_HEADER} must be a number of seconds from 0 to {MAX_OPEN_WAIT_S}",
            param=WAIT_HEADER,
        )
    return wait_s


def _with_usage(options: StreamOptions | None) -> bool:
    return bool(options and options.include_usage)


async def _event_stream(request: web.Request, events: list[str]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in events:
        await response.write(event.encode())
    await response.write_eof()
    return response


def _bearer(request: web.Request) -> str:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise ChatCompletionError(
            "missing Authorization: Bearer <key> (the session's api_key)",
            code="invalid_api_key",
            status=401,
            type="authentication_error",
        )
    return value.strip()


async def _json(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    raw = await request.read()
    if optional and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChatCompletionError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ChatCompletionError("the body must be a JSON object")
    return body


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["gateway_app", "serve_gateway"]
