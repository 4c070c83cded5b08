"""A small webhook environment server for tests: Starlette under uvicorn, on loopback.

It is written here, not taken from the SDK, so the control plane's check is
tested against the protocol itself. The first path segment of the URL picks a
behaviour (``http://127.0.0.1:PORT/<mode>``):

``ok``        valid answers            ``badjson``   /reset answers text
``nomsgs``    /reset lacks messages    ``http500``   /reset fails
``slow``      /reset sleeps 2 s        ``redirect``  /reset redirects

Every request is checked against ``secret``; a bad signature gets a 401, as a
real environment server would answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from rl_core.protocol.signing import HEADER, SignatureError, verify


@dataclass
class WebhookServer:
    secret: str
    port: int = 0
    seen: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (mode, path, body)

    def url(self, mode: str = "ok") -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            mode, path = request.path_params["mode"], request.path_params["action"]
            raw = await request.body()
            try:
                verify(self.secret, raw, request.headers.get(HEADER))
            except SignatureError as exc:
                return JSONResponse({"error": str(exc)}, status_code=401)
            self.seen.append((mode, path, await request.json()))
            if path == "close":
                return JSONResponse({})
            if mode == "badjson":
                return PlainTextResponse("<html>not json</html>")
            if mode == "nomsgs":
                return JSONResponse({"observation": "hi"})
            if mode == "http500":
                return PlainTextResponse("boom: env crashed", status_code=500)
            if mode == "slow":
                await asyncio.sleep(2)
            if mode == "redirect":
                return RedirectResponse("http://169.254.169.254/latest", status_code=307)
            return JSONResponse({"messages": [{"role": "user", "content": "Guess a number."}]})

        return Starlette(routes=[Route("/{mode}/{action}", handle, methods=["POST"])])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(secret: str) -> Iterator[WebhookServer]:
    """The webhook server on a free loopback port."""
    server = WebhookServer(secret=secret)
    with serve_app(server.app(), lifespan="off") as port:
        server.port = port
        yield server


@contextlib.contextmanager
def serve_app(app: Any, *, lifespan: str = "on") -> Iterator[int]:
    """Any ASGI app under uvicorn on a free loopback port, in a thread with its own loop."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=1
    )
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(uv.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start the app")
        time.sleep(0.01)
    try:
        yield int(sock.getsockname()[1])
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
        sock.close()
