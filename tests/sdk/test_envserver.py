"""sdk.envserver over real HTTP on loopback: signatures, idempotency, deferral, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rl_core.envs import MemoryCallbacks
from rl_core.protocol.signing import HEADER, sign
from sdk.cli import cli
from sdk.envserver import EnvServer, load_environment
from tests.sdk.serving import SECRET, Counted, Scripted, free_port, relay_app, serving

HTTP = httpx.Client(trust_env=False, timeout=10)  # one client: each new one loads the CA bundle


def post(url: str, body: dict[str, Any], *, secret: str = SECRET, **sig: Any) -> httpx.Response:
    raw = json.dumps(body).encode()
    headers = {HEADER: sign(secret, raw, **sig)} if secret else {}
    return HTTP.post(url, content=raw, headers=headers)


STEP = {"episode_id": "e1", "step": 1, "action": {"content": "hi", "tool_calls": []}}


def test_signed_requests_play_an_episode() -> None:
    env = Scripted()
    with serving(EnvServer(env, secret=SECRET).app) as url:
        reset = post(f"{url}/reset", {"episode_id": "e1", "seed": 3, "config": {"k": 1}})
        call = {"id": "c0", "name": "noop", "arguments": {}}
        step = post(f"{url}/step", {**STEP, "action": {"content": "hi", "tool_calls": [call]}})
        closed = post(f"{url}/close", {"episode_id": "e1"})
    assert reset.status_code == 200
    assert reset.json()["messages"] == [{"role": "user", "content": "hello 3"}]
    assert reset.json()["info"] == {"answer": "7", "k": 1}
    assert step.json() == {
        "messages": [{"role": "user", "content": "you said hi"}],
        "reward": 1.0,
        "done": False,
        "info": {"calls": ["noop"], "applied": 1},
    }
    assert closed.status_code == 200 and env.closed == ["e1"]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"secret": ""}, "missing X-Rlaas-Signature"),
        ({"secret": "another-secret-0123456"}, "does not match"),
        ({"timestamp": int(time.time()) - 600}, "window"),
    ],
)
def test_bad_signatures_are_401_with_the_reason(kwargs: dict[str, Any], reason: str) -> None:
    env = Scripted()
    with serving(EnvServer(env, secret=SECRET).app) as url:
        answer = post(f"{url}/reset", {"episode_id": "e", "seed": 0}, **kwargs)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "bad_signature"
    assert reason in answer.json()["error"]["message"]
    assert env.resets == 0


def test_bad_bodies_are_400_and_refusals_422() -> None:
    with serving(EnvServer(Scripted(refuse_reset=True), secret=SECRET).app) as url:
        no_seed = post(f"{url}/reset", {"episode_id": "e"})
        no_action = post(f"{url}/step", {"episode_id": "e", "step": 1})
        refused = post(f"{url}/reset", {"episode_id": "e", "seed": 1})
    assert (no_seed.status_code, no_action.status_code, refused.status_code) == (400, 400, 422)
    assert "'seed' must be a int" in no_seed.json()["error"]["message"]
    assert "refuses every reset" in refused.json()["error"]["message"]


def test_a_retried_step_returns_the_first_result_without_advancing() -> None:
    env = Scripted(fail_steps=1)
    with serving(EnvServer(env, secret=SECRET).app) as url:
        failed = post(f"{url}/step", STEP)  # an exception is not remembered: retry runs again
        first = post(f"{url}/step", STEP)
        again = post(f"{url}/step", {**STEP, "action": {"content": "different"}})
        reset_a = post(f"{url}/reset", {"episode_id": "e1", "seed": 1})
        reset_b = post(f"{url}/reset", {"episode_id": "e1", "seed": 1})
    assert failed.status_code == 500 and "scripted failure" in failed.json()["error"]["message"]
    assert first.json() == again.json()
    assert env.applied[("e1", 1)] == 1
    assert reset_a.json() == reset_b.json() and env.resets == 1


def test_a_reset_after_steps_starts_a_new_episode_under_the_same_id() -> None:
    env = Scripted()
    with serving(EnvServer(env, secret=SECRET).app) as url:
        post(f"{url}/reset", {"episode_id": "e1", "seed": 1})
        first = post(f"{url}/step", STEP).json()
        post(f"{url}/reset", {"episode_id": "e1", "seed": 1})
        second = post(f"{url}/step", STEP).json()
    assert env.resets == 2 and env.applied[("e1", 1)] == 2
    assert (first["info"]["applied"], second["info"]["applied"]) == (1, 2)


def test_slow_steps_are_deferred_and_posted_signed_to_the_callback_url() -> None:
    env = Scripted(step_delays=[0.3])
    callbacks = MemoryCallbacks()
    with serving(relay_app(callbacks)) as relay:
        server = EnvServer(env, secret=SECRET, callback_url=f"{relay}/cb", defer_after_s=0.05)
        with serving(server.app) as url:
            deferred = post(f"{url}/step", STEP)
            retried = post(f"{url}/step", STEP)  # still running: deferred again, not re-run
            deadline = time.monotonic() + 5
            while not callbacks.delivered and time.monotonic() < deadline:
                time.sleep(0.02)
            after = post(f"{url}/step", STEP)  # done now: the cached result, synchronously
    assert (deferred.status_code, deferred.json()) == (202, {"deferred": True})
    assert retried.status_code == 202
    assert callbacks.delivered == [("e1", 1)]
    assert after.status_code == 200 and after.json()["reward"] == 1.0
    assert env.applied[("e1", 1)] == 1


def deliver_once(refusals: list[tuple[int, dict[str, str]]]) -> tuple[MemoryCallbacks, Counted]:
    """One deferred step of a server whose callbacks meet ``refusals`` first; returns what
    reached the waiter and the posts made, once the server has delivered or given up."""
    callbacks = MemoryCallbacks()
    relay = Counted(relay_app(callbacks, refusals=refusals))
    env = Scripted(step_delays=[0.2])
    with serving(relay) as relay_url:
        server = EnvServer(env, secret=SECRET, callback_url=f"{relay_url}/cb", defer_after_s=0.05)
        with serving(server.app) as url:
            assert post(f"{url}/step", STEP).status_code == 202
            deadline = time.monotonic() + 10
            while not server_idle(server) and time.monotonic() < deadline:
                time.sleep(0.02)
    return callbacks, relay


def server_idle(server: EnvServer) -> bool:
    return not server._background  # the delivery task is gone: delivered or given up


def test_a_deferred_result_names_its_step_and_a_busy_control_plane_is_retried() -> None:
    callbacks, relay = deliver_once([(429, {"Retry-After": "1"}), (503, {})])
    assert callbacks.delivered == [("e1", 1)]
    assert relay.requests["/cb/e1/1"] == 3
    taken = asyncio.run(callbacks.wait("e1", 1, timeout_s=0))
    assert taken is not None
    assert (taken["episode_id"], taken["step"], taken["reward"]) == ("e1", 1, 1.0)


@pytest.mark.parametrize("status", [409, 410, 403, 422])
def test_a_final_answer_ends_the_deliveries(status: int) -> None:
    callbacks, relay = deliver_once([(status, {})])
    assert callbacks.delivered == []
    assert relay.requests["/cb/e1/1"] == 1


def test_server_options_and_loading_are_checked() -> None:
    with pytest.raises(ValueError, match="callback_url"):
        EnvServer(Scripted(), secret=SECRET, defer_after_s=1.0)
    with pytest.raises(ValueError, match="16 characters"):
        EnvServer(Scripted(), secret="short")
    with pytest.raises(ValueError, match="MODULE:CLASS"):
        load_environment("rl_core.envs.calculator")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        load_environment("rl_core.envs.calculator:Nope")
    with pytest.raises(ValueError, match="reset/step/close"):
        load_environment("collections:OrderedDict")


def test_cli_env_serve_serves_a_builtin() -> None:
    port = free_port()
    env = {**os.environ, "MY_SECRET": SECRET}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sdk.cli",
            "env",
            "serve",
            "rl_core.envs.calculator:Calculator",
            "--port",
            str(port),
            "--secret-env",
            "MY_SECRET",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if HTTP.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        reset = post(f"{url}/reset", {"episode_id": "e", "seed": 4, "config": {}})
        assert reset.status_code == 200
        assert reset.json()["tools"][0]["function"]["name"] == "calculator"
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_env_serve_refuses_a_missing_or_short_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHORT_SECRET", "short")
    monkeypatch.delenv("RLAAS_ENV_SECRET", raising=False)
    runner = CliRunner()
    for extra in ([], ["--secret-env", "SHORT_SECRET"]):
        done = runner.invoke(cli, ["env", "serve", "rl_core.envs.calculator:Calculator", *extra])
        assert done.exit_code == 2
        assert "at least 16 characters" in done.output
