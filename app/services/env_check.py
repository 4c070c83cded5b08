"""``POST /v1/environments/{id}/check``: call the webhook's /reset and /close once.

A tenant learns here, before any compute is spent, whether the control plane
can reach the server, whether the server accepts our signature and whether it
answers in protocol shape. Each failure is reported in words (DNS, refused,
timeout, HTTP status, not JSON, missing fields), never as a 5xx of ours.
Redirects are not followed: a redirect could lead past the URL allow-list. The
connection goes to the address the allow-list checked (``address``), with the URL's
name as Host and TLS name, never to a second lookup of the name.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from app.schemas.environments import CheckCall, CheckRead
from app.urlcheck import IPAddress
from rl_core.protocol.signing import HEADER, sign


async def check(
    url: str, secret: str, timeout_s: float, *, address: IPAddress | None = None
) -> CheckRead:
    episode_id = f"check~{uuid.uuid4().hex[:12]}"
    calls: list[CheckCall] = []
    target, headers, extensions = _pinned(url, address)
    async with httpx.AsyncClient(
        timeout=timeout_s, follow_redirects=False, headers=headers
    ) as client:
        reset = await _call(
            client,
            target,
            "/reset",
            {"episode_id": episode_id, "seed": 0, "config": {}},
            secret,
            extensions,
        )
        if reset.ok:
            assert reset.body is not None
            problem = _reset_shape(reset.body)
            reset.call.ok, reset.call.error = problem is None, problem
        calls.append(reset.call)
        # Close even after a bad reset answer: the server may have opened an episode.
        if reset.call.status_code is not None:
            closed = await _call(
                client, target, "/close", {"episode_id": episode_id}, secret, extensions
            )
            calls.append(closed.call)
    error = next((f"{c.path}: {c.error}" for c in calls if c.error), None)
    return CheckRead(ok=error is None, error=error, calls=calls)


class _Outcome:
    def __init__(self, call: CheckCall, body: Any = None) -> None:
        self.call, self.body = call, body

    @property
    def ok(self) -> bool:
        return self.call.ok


def _pinned(url: str, address: IPAddress | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` with its host replaced by ``address``; the Host header and TLS name that
    keep the server seeing the name it was registered under."""
    if address is None:
        return url, {}, {}
    parts = urlsplit(url)
    assert parts.hostname is not None
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{host}:{parts.port}" if parts.port else host
    target = urlunsplit(parts._replace(netloc=netloc))
    named = parts.netloc.rpartition("@")[2]
    return target, {"Host": named}, {"sni_hostname": parts.hostname}


async def _call(
    client: httpx.AsyncClient,
    url: str,
    path: Literal["/reset", "/close"],
    payload: dict[str, Any],
    secret: str,
    extensions: dict[str, Any],
) -> _Outcome:
    raw = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", HEADER: sign(secret, raw)}
    started = time.perf_counter()

    def done(ok: bool, status: int | None, error: str | None, body: Any = None) -> _Outcome:
        ms = (time.perf_counter() - started) * 1000
        call = CheckCall(path=path, ok=ok, status_code=status, duration_ms=ms, error=error)
        return _Outcome(call, body)

    try:
        response = await client.post(
            url + path, content=raw, headers=headers, extensions=extensions
        )
    except httpx.TimeoutException:
        return done(
            False, None, f"no answer within the environment's timeout_s={client.timeout.read}s"
        )
    except httpx.HTTPError as exc:
        return done(False, None, _transport_error(exc))
    status = response.status_code
    if status in (401, 403):
        return done(False, status, f"HTTP {status}: the server refused our {HEADER}; "
                    "check that it uses the secret you registered")  # fmt: skip
    if 300 <= status < 400:
        where = response.headers.get("location", "?")
        return done(False, status, f"HTTP {status} redirect to {where}; register the final URL")
    if status != 200:
        return done(False, status, f"HTTP {status}: {_snippet(response.text)}")
    if path == "/close":
        return done(True, status, None)
    try:
        body = response.json()
    except ValueError:
        return done(False, status, f"the answer is not JSON: {_snippet(response.text)}")
    return done(True, status, None, body)


def _reset_shape(body: Any) -> str | None:
    """What is wrong with a /reset answer, or None: {messages: [{role, content}], ...}."""
    if not isinstance(body, dict):
        return f"the answer must be a JSON object, not {type(body).__name__}"
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "the answer lacks 'messages' (a list of {role, content})"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return f"messages[{i}] must be an object with a string 'content'"
        if message.get("role") not in ("system", "user"):
            return f"messages[{i}].role must be 'system' or 'user', not {message.get('role')!r}"
    return None


def _transport_error(exc: httpx.HTTPError) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return f"the host name does not resolve (DNS: {cause.strerror or cause})"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused: is the environment server running on that port?"
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    if "Name or service not known" in text or "nodename nor servname" in text:
        return f"the host name does not resolve (DNS: {text})"
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused: is the environment server running on that port?"
    return f"could not reach the server: {text}"


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return (text[:200] + "…") if len(text) > 200 else (text or "(empty body)")
