"""Test helpers: uvicorn on a loopback port in a thread, and environments that misbehave on cue."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rl_core.envs import Action, MemoryCallbacks, Reset, Step
from rl_core.errors import EnvironmentFailure
from rl_core.protocol import webhook as wire
from rl_core.protocol.signing import HEADER, SignatureError, verify

SECRET = "test-secret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(app: Any, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields its base URL."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port or 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class Counted:
    """ASGI wrapper that counts the HTTP requests reaching ``app``, by path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: Counter[str] = Counter()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests[scope["path"]] += 1
        await self.app(scope, receive, send)


@dataclasses.dataclass
class Scripted:
    """An environment that counts what it really did, and fails or stalls on cue.

    ``step_delays`` are taken one per step call (then 0); ``fail_steps`` step
    calls raise RuntimeError (the server answers 500) before doing anything;
    ``fail_late`` step calls raise after their delay (a deferred step that fails);
    ``refuse_reset`` makes reset raise `EnvironmentFailure` (422).
    """

    step_delays: list[float] = dataclasses.field(default_factory=list)
    fail_steps: int = 0
    refuse_reset: bool = False
    fail_late: int = 0  # step calls that raise RuntimeError after their delay
    applied: Counter[tuple[str, int]] = dataclasses.field(default_factory=Counter)
    resets: int = 0
    closed: list[str] = dataclasses.field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    # Set by the test to let steps finish: until then each step holds its request open
    # (a server still working), whatever the clock says.
    hold: threading.Event | None = None

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        if self.refuse_reset:
            raise EnvironmentFailure("scripted: this server refuses every reset")
        self.resets += 1
        return Reset(
            messages=[{"role": "user", "content": f"hello {seed}"}],
            tools=[{"type": "function", "function": {"name": "noop"}}],
            info={"answer": "7", **config},
        )

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        if self.fail_steps > 0:
            self.fail_steps -= 1
            raise RuntimeError("scripted failure")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.step_delays.pop(0) if self.step_delays else 0.0)
            if self.hold is not None:
                await asyncio.to_thread(self.hold.wait)  # set from the test's thread
        finally:
            self.in_flight -= 1
        if self.fail_late > 0:
            self.fail_late -= 1
            raise RuntimeError("scripted late failure")
        self.applied[(episode_id, step)] += 1
        calls = [c.name for c in action.tool_calls]
        return Step(
            messages=[{"role": "user", "content": f"you said {action.content}"}],
            reward=float(step),
            done=step >= 2,
            info={"calls": calls, "applied": self.applied[(episode_id, step)]},
        )

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)


def relay_app(
    callbacks: MemoryCallbacks,
    secret: str = SECRET,
    *,
    refusals: list[tuple[int, dict[str, str]]] | None = None,
) -> Starlette:
    """What the control plane does with a deferred result: verify it, check that it names
    the URL's step, hand it to the waiter. ``refusals`` (status, headers) are answered
    first, one per post, as a busy or refusing control plane would."""
    pending = list(refusals or [])

    async def receive(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            verify(secret, raw, request.headers.get(HEADER))
        except SignatureError as exc:
            return JSONResponse({"error": str(exc)}, status_code=401)
        if pending:
            status, headers = pending.pop(0)
            error = {"code": "refused", "message": f"scripted {status}"}
            return JSONResponse({"error": error}, status_code=status, headers=headers)
        episode_id, step = request.path_params["episode_id"], int(request.path_params["step"])
        body = await request.json()
        bound = wire.parse_bound_callback(body)
        if (bound.episode_id, bound.step) != (episode_id, step):
            return JSONResponse({"error": "signed for another step"}, status_code=403)
        callbacks.deliver(episode_id, step, body)
        return JSONResponse({"accepted": True}, status_code=202)

    return Starlette(routes=[Route("/cb/{episode_id}/{step}", receive, methods=["POST"])])
