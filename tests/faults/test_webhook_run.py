"""A webhook environment run end to end through PostgreSQL, Redis, the API and a real
worker, every step deferred: the environment answers 202 and posts the result to the
API's ``/v1/env-callbacks``, where the worker's long poll picks it up.

The environment server is the SDK's (``rlaas env serve``) in its own process, over the
demo game slowed down (slow_game.py), registered and checked through the public API.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import httpx
import pytest

from tests.e2e.stack import Stack, free_port, rlaas, wait_until
from tests.faults.conftest import finished

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]


def test_a_webhook_run_with_deferred_steps_trains_through_the_whole_stack(
    private_stack: tuple[Stack, str],
) -> None:
    stack, _ = private_stack
    stack.env["RLAAS_ENV_URL_ALLOWLIST"] = "loopback"  # the environment runs on this machine
    secret = secrets.token_urlsafe(24)
    env_port = free_port()
    stack.env["RLAAS_ENV_SECRET"] = secret
    stack.start_api()
    stack.start(
        "envserver",
        [
            *rlaas(), "env", "serve", "tests.faults.slow_game:SlowGuessNumber",
            "--port", str(env_port), "--secret-env", "RLAAS_ENV_SECRET",
            "--callback-url", f"{stack.api_url}/v1/env-callbacks", "--defer-after", "0.05",
        ],
    )  # fmt: skip
    env_url = f"http://127.0.0.1:{env_port}"
    wait_until(lambda: _up(env_url), 60, "the environment server", stack)
    stack.start_worker()

    with stack.client() as client:
        registered = client.post(
            "/v1/environments",
            json={"name": "slow-game", "url": env_url, "secret": secret, "max_concurrency": 64},
        )
        assert registered.status_code == 201, registered.text
        env_id = registered.json()["id"]
        check = client.post(f"/v1/environments/{env_id}/check").json()
        assert check["ok"], check
        spec: dict[str, Any] = {
            "model": {"source": "builtin:tiny"},
            "environment": {"name": env_id, "config": {"low": 1, "high": 3, "max_turns": 2}},
            "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 96},
            "rollout": {"group_size": 4, "concurrency": 16},
            "algorithm": {"batch_groups": 2, "learning_rate": 0.003},
            "train": {"steps": 3, "seed": 0},
        }
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]

        run = finished(stack, client, run_id)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"}).json()
        assert [p["step"] for p in points["points"]] == [1, 2, 3]
        failed = client.get(f"/v1/runs/{run_id}/metrics", params={"name": "failures/total"}).json()
        assert all(p["value"] == 0 for p in failed["points"]), failed
        page = client.get(f"/v1/runs/{run_id}/trajectories", params={"limit": 50}).json()
        played = [t for t in page["items"] if t["end_state"] in ("done", "truncated")]
        assert played and any(t["turns"] >= 1 for t in played)

    # Every step was deferred (202 from the environment), and every deferred result came
    # back through the API's callback route, by the two servers' access logs: taken (202),
    # or 410 for a step of an episode the run's end cancelled while it ran.
    env_log = (stack.logs / "envserver.log").read_text(errors="replace")
    api_log = (stack.logs / "api.log").read_text(errors="replace")
    steps = re.findall(r'"POST /step HTTP/1.1" (\d+)', env_log)
    callbacks = re.findall(r'"POST /v1/env-callbacks/\S+ HTTP/1.1" (\d+)', api_log)
    assert steps and set(steps) == {"202"}, steps
    assert len(callbacks) == len(steps) and set(callbacks) <= {"202", "410"}, callbacks
    assert callbacks.count("202") >= 1


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
