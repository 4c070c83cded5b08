"""The body limit at the HTTP edge: 413 before a route reads a body over the caller's quota.

From ``Content-Length`` when sent, and by counting while the body streams in
(a chunked body has no length to trust). The limit is the tenant's
``body_bytes`` quota (``app.services.quotas.Limiter.body_limit``), or the
worker's for ``/internal/``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from app.db.session import DATABASE_DOWN, DATABASE_RETRY_AFTER_S, database_unreachable
from app.errors import PayloadTooLarge
from app.security import parse_prefix
from app.services.quotas import Limiter
from app.settings import Settings


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for a body over the caller's limit, before and while it is read (pure ASGI).

    When the limit trips mid-stream the route's own answer (FastAPI turns the
    failed read into a 400) is dropped and the 413 goes out instead.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        declared = _int_or_none(headers.get("content-length"))
        if not declared and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body to limit
            return
        try:
            limit, name = await _limit_for(scope, headers)
        except DATABASE_DOWN as exc:
            # The tenant's limit is read from the database before any route runs, so the
            # app's 503 handler never sees this: answer its 503 here (a restart under load
            # gave callers a bare 500 without Retry-After).
            if not database_unreachable(exc):
                raise
            await _unavailable(send)
            return
        if declared is not None and declared > limit:
            await _reject(send, declared, limit, name)
            return
        received = 0
        tripped = started = False

        async def counted() -> Any:
            nonlocal received, tripped
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    tripped = True
                    raise _TooLarge
            return message

        async def guarded(message: Any) -> None:
            nonlocal started
            if tripped:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_TooLarge):
            await self.app(scope, counted, guarded)
        if tripped and not started:
            await _reject(send, received, limit, name, at_least=True)


async def _limit_for(scope: Any, headers: dict[str, str]) -> tuple[int, str]:
    """The caller's limit and what to call it in a 413."""
    app_state = scope["app"].state.rlaas
    settings: Settings = app_state.settings
    if scope["path"].startswith("/internal/"):
        return settings.internal_body_bytes, "internal_body_bytes"
    if scope["path"].rstrip("/") == "/v1/datasets":
        # An upload streams to disk (app.services.datasets), never whole in memory: its
        # own cap, which the service also counts against.
        return settings.dataset_max_bytes, "dataset_max_bytes, the operator's cap on one upload"
    if scope["path"].rstrip("/") == "/v1/adapters":  # the same for adapters (app.services.adapters)
        return settings.adapter_max_bytes, "adapter_max_bytes, the operator's cap on one upload"
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" and headers.get("x-api-key"):
        # The Tinker SDK's header, its key prefixed tml- (app/api/tinker.py).
        scheme, token = "bearer", headers["x-api-key"].removeprefix("tml-")
    prefix = parse_prefix(token.strip()) if scheme.lower() == "bearer" else None
    limiter: Limiter = app_state.limits
    return await limiter.body_limit(app_state.sessions, prefix), "quota body_bytes"


async def _reject(send: Any, size: int, limit: int, name: str, *, at_least: bool = False) -> None:
    error = PayloadTooLarge(
        f"the request body is {'over ' if at_least else ''}{size} bytes; the limit is "
        f"{limit} bytes ({name}): send less per request",
        limit_bytes=limit,
    )
    body = {"code": error.code, "message": error.message, "field": error.field, **error.extra}
    # The body was not read: the connection cannot serve another request.
    await _answer(send, 413, body, [(b"connection", b"close")])


async def _unavailable(send: Any) -> None:
    """The app's answer while the database is unreachable (app.main._render_database_down)."""
    message = f"the database is unreachable; retry in {DATABASE_RETRY_AFTER_S} s"
    error = {"code": "unavailable", "message": message, "field": None}
    retry = [(b"retry-after", str(DATABASE_RETRY_AFTER_S).encode())]
    await _answer(send, 503, {**error, "retry_after_s": DATABASE_RETRY_AFTER_S}, retry)


async def _answer(
    send: Any, status: int, error: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    """An error answer in the app's shape (``{"error": {...}}``), sent from the middleware."""
    body = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
