"""A run that fails or stops with episodes in flight still sends every one of them its
``/close``, promptly and in parallel: the pipeline, the agent and a real
`WebhookEnvironment` over HTTP on loopback against a server that records what it got."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest

from rl_core.envs.errors import FailureBudgetExhausted
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.host.control import RunControl
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import WebhookCallSpec
from tests.sdk.serving import SECRET, serving

from .conftest import parse_id, run_pipeline

HANG_S = 20.0  # a step that hangs outlives the run: only its episode's close ends it
CLOSE_WITHIN_S = 8.0  # the page promises 10 s; the hung steps would take 20 s more


class Recorder:
    """Resets, steps and closes by episode (with when each close came); steps of member
    0 are refused (422), the others hang until the server stops or ``release`` is set."""

    def __init__(self) -> None:
        self.resets: set[str] = set()
        self.closes: dict[str, float] = {}  # the first close of each episode: when
        self.closes_sent: Counter[str] = Counter()
        self.steps: set[str] = set()
        self.release = threading.Event()
        self.lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        episode = json.loads(body)["episode_id"]
        route = scope["path"]
        status, answer = 200, {}
        with self.lock:
            if route == "/reset":
                self.resets.add(episode)
                answer = {"messages": [{"role": "user", "content": "go"}]}
            elif route == "/close":
                self.closes.setdefault(episode, time.monotonic())
                self.closes_sent[episode] += 1
                answer = {"closed": True}
            else:
                self.steps.add(episode)
        if route == "/step":
            if parse_id(episode)[1] == 0:
                status, answer = 422, {"error": {"code": "refused", "message": "no"}}
            else:
                started = time.monotonic()
                while not self.release.is_set() and time.monotonic() - started < HANG_S:  # noqa: ASYNC110 (set from the test's thread)
                    await asyncio.sleep(0.02)
                answer = {"reward": 1.0, "done": True}
        raw = json.dumps(answer).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})


def webhook(url: str, **policy: Any) -> WebhookEnvironment:
    target = WebhookTarget(
        id="env_closes",
        url=url,
        secret=SECRET,
        timeout_s=HANG_S * 2,
        max_concurrency=64,
        allowlist=Allowlist.parse("loopback", embedded=False),
    )
    return WebhookEnvironment(target, policy=WebhookCallSpec(backoff_s=0.01, **policy))


def test_a_failed_run_closes_every_episode_in_flight_within_seconds() -> None:
    """The failure budget runs out (member 0 of each group is refused) while 30 other
    episodes hang in their step. Every episode that was reset gets its close, all within
    a few seconds of the failure, though the server would hold each step 20 s more."""
    server = Recorder()
    with serving(server) as url:
        env = webhook(url, failure_budget=0.0, failure_budget_min=1)
        failed_at = 0.0
        with pytest.raises(FailureBudgetExhausted):
            try:
                run_pipeline(
                    steps=2, batch_groups=8, group_size=4, concurrency=32, env=env,  # type: ignore[arg-type]
                    episode_timeout_s=None, timeout_s=HANG_S,
                )  # fmt: skip
            finally:
                failed_at = time.monotonic()
        server.release.set()
    hung = {e for e in server.steps if parse_id(e)[1] != 0}
    assert len(hung) >= 16, server.steps  # episodes were in flight when the run failed
    # One close for each reset, and none for the episodes the budget refused before
    # their reset went out.
    assert server.resets and set(server.closes) == server.resets, server.resets ^ set(server.closes)
    assert set(server.closes_sent.values()) == {1}
    latest = max(server.closes.values())
    assert latest - min(server.closes.values()) < CLOSE_WITHIN_S
    assert latest <= failed_at  # the run's failure came only once the closes were sent


def test_a_stopped_run_closes_every_episode_in_flight() -> None:
    """A stop (the user's cancel) while episodes hang: each gets its close."""
    server = Recorder()
    control = RunControl()

    def stop_soon() -> None:
        deadline = time.monotonic() + HANG_S
        while len(server.steps) < 12 and time.monotonic() < deadline:
            time.sleep(0.02)
        control.request_stop()

    with serving(server) as url:
        env = webhook(url, failure_budget=1.0)
        stopper = threading.Thread(target=stop_soon)
        stopper.start()
        started = time.monotonic()
        run = run_pipeline(
            steps=2, batch_groups=8, group_size=4, concurrency=32, env=env,  # type: ignore[arg-type]
            episode_timeout_s=None, timeout_s=HANG_S, control=control,
        )  # fmt: skip
        stopper.join()
        server.release.set()
    assert run.result.stopped_early
    assert time.monotonic() - started < HANG_S / 2
    assert server.resets and set(server.closes) == server.resets
    assert set(server.closes_sent.values()) == {1}
