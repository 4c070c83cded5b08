"""A webhook environment server that misbehaves on a seeded plan, under the test's control.

`FaultyEnv` is an ASGI app: `sdk.envserver.EnvServer` (signatures, idempotent steps)
around a one-step game, behind an injector that answers some ``/reset`` and ``/step``
requests itself instead. Which request gets which fault is drawn from a seeded random
generator keyed by ``(route, episode_id, step, n-th time this request came)``, so it
does not depend on the order in which requests arrive; a retry draws again. Some
faults are placed by counting arrivals, never by a clock:

- one of each fault in `FAULTS`, for the first resets and steps from arrival
  `forced_at` on (so each happens at least once, whatever the draw);

- a run of stragglers: the `straggler_run` resets and steps that arrive from
  `straggler_at` on answer after half the client's timeout (slow, but in time);
- an outage: from the first arrival at or after `outage_at` when this server is
  answering nothing the worker would take as a sign of life (so no success lands in
  the middle of it and resets the breaker's count), every request, ``/close`` too,
  is answered ``500`` until `outage_len` have been.

The faults (`FAULTS`, drawn per request with the rates of `FaultPlan.rates`):

=============  ============================================================
timeout        nothing until 1.5x the client's timeout, then the real answer
status_5xx     500, 502 or 504 with the protocol's error body
malformed      200 with a body cut short (not JSON)
hang           200 headers and the start of a body, then nothing until the
               client hangs up
oversized      200 with a valid answer of 9 MiB, its length declared
slow_drip      the real answer, one byte every 50 ms (longer than the timeout)
redirect       307 to the same URL
=============  ============================================================

`injected` counts what was done by fault; `doomed` holds the episodes that got a
fault no retry can mend (malformed, oversized, redirect): those must fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from sdk.envserver import EnvServer

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FAULTS = ("timeout", "status_5xx", "malformed", "hang", "oversized", "slow_drip", "redirect")
DOOMING = frozenset({"malformed", "oversized", "redirect"})  # not retried by the worker
# Answers the worker takes as a sign that the server is up (the breaker's success).
MAY_SUCCEED = frozenset({None, "straggler", "oversized", "malformed", "redirect"})
OVERSIZED_BYTES = 9 * 1024 * 1024  # over rl_core.envs.transport.MAX_ANSWER_BYTES
DRIP_S = 0.05
HANG_LIMIT_S = 60.0  # a hang ends when the client hangs up; this only bounds a broken test


class OneStepGame:
    """Say a number from 1 to 3; the one step pays 1.0 for ``seed % 3 + 1``."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        self.targets[episode_id] = str(seed % 3 + 1)
        prompt = "Guess a number from 1 to 3. Answer with the number only."
        return Reset(messages=[{"role": "user", "content": prompt}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        said = action.content
        return Step(messages=[], reward=float(self.targets.get(episode_id, "") in said), done=True)

    async def close(self, episode_id: str) -> None:
        self.targets.pop(episode_id, None)


@dataclasses.dataclass
class FaultPlan:
    """Fault rates per request (the rest are answered normally) and the ordered faults."""

    rates: Mapping[str, float]
    seed: int = 0
    forced_at: int | None = None  # from this arrival, one of each fault (see the docstring)
    straggler_at: int | None = None
    straggler_run: int = 20
    outage_at: int | None = None
    outage_len: int = 60

    def draw(self, route: str, episode_id: str, step: int, nth: int) -> str | None:
        rng = random.Random(f"{self.seed}:{route}:{episode_id}:{step}:{nth}")
        x = rng.random()
        for fault in FAULTS:
            x -= self.rates.get(fault, 0.0)
            if x < 0:
                return fault
        return None


class FaultyEnv:
    """The ASGI app; serve it with ``tests.sdk.serving.serving``."""

    def __init__(self, plan: FaultPlan, *, secret: str, client_timeout_s: float) -> None:
        self.plan = plan
        self.timeout_s = client_timeout_s
        self.inner: Any = EnvServer(OneStepGame(), secret=secret).app
        self.injected: Counter[str] = Counter()
        self.doomed: set[str] = set()
        self.arrivals = 0
        self.outage_answered = 0
        self.outage_started_at: int | None = None
        self._seen: Counter[tuple[str, str, int]] = Counter()
        self._forced = 0
        self._may_succeed = 0  # requests being answered with something the breaker calls up
        # 5xx the game's own server answered (or uvicorn for it, when it raised before
        # answering): not injected, but the worker meets and counts them all the same.
        self.unplanned_5xx = 0
        self._lock = threading.Lock()  # uvicorn runs this in its own thread; tests read it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        body = await _read_body(receive)
        fault = self._decide(scope["path"], body)
        replay = _replaying(body, receive)
        started: list[int] = []

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.append(int(message["status"]))
                if fault is None and message["status"] >= 500:
                    with self._lock:
                        self.unplanned_5xx += 1
            await send(message)

        try:
            if fault is None:
                await self.inner(scope, replay, watched)
            else:
                await self._inject(fault, scope, replay, watched, body)
        except Exception:
            if not started:  # uvicorn answers 500 for an app that raised before answering
                with self._lock:
                    self.unplanned_5xx += 1
            raise
        finally:
            with self._lock:
                self._may_succeed -= fault in MAY_SUCCEED

    def _decide(self, route: str, body: bytes) -> str | None:
        """The fault for this request, if any, counted at once."""
        with self._lock:
            fault = self._draw(route, body)
            if fault is not None:
                self.injected[fault] += 1
            self._may_succeed += fault in MAY_SUCCEED
            return fault

    def _draw(self, route: str, body: bytes) -> str | None:
        """Called under the lock."""
        self.arrivals += 1
        n = self.arrivals
        plan = self.plan
        if (
            plan.outage_at is not None
            and self.outage_started_at is None
            and n >= plan.outage_at
            and self._may_succeed == 0
        ):
            self.outage_started_at = n
        if self.outage_started_at is not None and self.outage_answered < plan.outage_len:
            self.outage_answered += 1
            return "outage"
        if route not in ("/reset", "/step"):
            return None
        stragglers_due = plan.straggler_at is not None and n >= plan.straggler_at
        if stragglers_due and self.injected["straggler"] < plan.straggler_run:
            return "straggler"
        forced = None
        if plan.forced_at is not None and n >= plan.forced_at and self._forced < len(FAULTS):
            forced = FAULTS[self._forced]
            self._forced += 1
        try:
            request = json.loads(body)
            episode_id, step = str(request["episode_id"]), int(request.get("step", 0))
        except (ValueError, KeyError, TypeError):
            return None  # not ours to judge: EnvServer answers it
        key = (route, episode_id, step)
        self._seen[key] += 1
        fault = forced or plan.draw(route, episode_id, step, self._seen[key])
        if fault in DOOMING:
            self.doomed.add(episode_id)
        return fault

    async def _inject(
        self, fault: str, scope: Scope, receive: Receive, send: Send, body: bytes
    ) -> None:
        if fault == "straggler":
            await asyncio.sleep(self.timeout_s / 2)
            await self.inner(scope, receive, send)
        elif fault == "timeout":
            await asyncio.sleep(self.timeout_s * 1.5)
            await self.inner(scope, receive, send)
        elif fault in ("status_5xx", "outage"):
            status = 500 if fault == "outage" else random.Random(body).choice([500, 502, 504])
            error = {"error": {"code": "injected", "message": f"injected {fault} ({status})"}}
            await _answer(send, status, json.dumps(error).encode())
        elif fault == "malformed":
            await _answer(send, 200, b'{"messages": [], "reward": 1.0, "done": tr')
        elif fault == "redirect":
            await _answer(send, 307, b"", [(b"location", scope["path"].encode())])
        elif fault == "hang":
            await _start(send, 200, [(b"content-length", b"100")])
            await send({"type": "http.response.body", "body": b'{"messages": [', "more_body": True})
            async with asyncio.timeout(HANG_LIMIT_S):
                await _hung_up(receive)
        elif fault == "oversized":
            # Its length declared, so the worker refuses it from the header, at once: read
            # in full it could outlast the timeout on a busy machine and be retried (the
            # cap on a body sent without a length: test_webhook's chunked 9 MiB answer).
            pad = "x" * (OVERSIZED_BYTES - 100)
            body = f'{{"messages": [], "reward": 0.0, "done": true, "info": {{"pad": "{pad}"}}}}'
            await _answer(send, 200, body.encode())
        elif fault == "slow_drip":
            await self._drip(scope, receive, send)
        else:
            raise AssertionError(f"unknown fault {fault}")

    async def _drip(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The real answer, a byte every `DRIP_S`, until it is sent or the client hangs up."""
        answer = await _captured(self.inner, scope, receive)
        await _start(send, answer.status, [(b"content-length", str(len(answer.body)).encode())])
        gone = asyncio.ensure_future(_hung_up(receive))
        try:
            for i in range(len(answer.body)):
                await asyncio.sleep(DRIP_S)
                if gone.done():  # the client gave up: stop, as a real server's write would
                    return
                more = i < len(answer.body) - 1
                piece = answer.body[i : i + 1]
                await send({"type": "http.response.body", "body": piece, "more_body": more})
        finally:
            gone.cancel()


@dataclasses.dataclass
class _Captured:
    status: int = 0
    body: bytes = b""


async def _captured(app: Any, scope: Scope, receive: Receive) -> _Captured:
    """Run ``app`` and keep its answer instead of sending it."""
    out = _Captured()

    async def keep(message: Message) -> None:
        if message["type"] == "http.response.start":
            out.status = message["status"]
        elif message["type"] == "http.response.body":
            out.body += message.get("body", b"")

    await app(scope, receive, keep)
    return out


async def _hung_up(receive: Receive) -> None:
    """Until the client closes the connection."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body already read, then waits on the real one."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _start(send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _answer(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _start(send, status, [(b"content-length", str(len(body)).encode()), *(headers or [])])
    await send({"type": "http.response.body", "body": body})
