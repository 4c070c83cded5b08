"""One run through the whole product: tenant key → POST /v1/runs → Celery worker → metrics."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = pytest.mark.e2e


def test_tiny_game_run_succeeds_with_reward_per_step(stack: Stack) -> None:
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    steps = spec["train"]["steps"]

    with stack.client() as client:
        created = client.post("/v1/runs", json={"spec": spec})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        assert created.json()["status"] == "queued"

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(finished, 300, f"run {run_id} to finish", stack)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["current_step"] == steps

        metrics = client.get(f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"})
        assert metrics.status_code == 200
        points = metrics.json()["points"]
        assert [p["step"] for p in points] == list(range(1, steps + 1))
        assert all(0.0 <= p["value"] <= 1.0 for p in points)

        events = client.get(f"/v1/runs/{run_id}/events").json()
        statuses = [e["to_status"] for e in events["items"]]
        assert statuses == ["queued", "starting", "running", "succeeded"]
