"""The API process is killed (SIGKILL) twice mid-run and started again: no metric point,
span, trajectory or status change is lost or stored twice.

The worker keeps training through each outage; its reports wait under their batch
numbers and are sent again once the API is back, and the API stores a batch once
(docs/lifecycle.md, "Reports: numbered batches, stored once"). A batch the killed API
had stored but not answered is sent again and must not be stored again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until
from tests.faults.conftest import finished, retries

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_an_api_killed_twice_mid_run_loses_and_doubles_nothing(
    private_stack: tuple[Stack, str],
) -> None:
    stack, _ = private_stack
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    # 16 steps: the kills come at steps 3 and 10, and the run must still be training after.
    spec["train"]["steps"] = steps = 16

    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]
    for at_step in (3, 10):
        wait_until(lambda n=at_step: step_of(stack, run_id) >= n, 240, f"step {at_step}", stack)
        kill(stack, "api")
        retried = retries(stack)
        # Down until the worker has had to retry a report into the outage (its reports
        # now wait for the API), well within the 60 s lease.
        wait_until(lambda r=retried: retries(stack) > r, 60, "the worker to retry", stack)
        stack.start_api()

    with stack.client() as client:
        run = finished(stack, client, run_id)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["attempts"] == 1  # each outage was shorter than the lease

        for name in ("reward/mean", "loss", "trajectories_per_s"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, steps + 1)), name

        trace = client.get(f"/v1/runs/{run_id}/timeline", params={"limit": 100_000}).json()
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        train = sorted(e["args"]["step"] for e in spans if e["name"] == "train_step")
        assert train == list(range(1, steps + 1))
        doubled = [k for k, n in Counter(span_key(e) for e in spans).items() if n > 1]
        assert not doubled, doubled[:5]

        trajectories = all_trajectories(client, run_id)
        assert trajectories, "no trajectory reached the API"
        twice = [k for k, n in Counter(t["episode_id"] for t in trajectories).items() if n > 1]
        assert not twice, twice[:5]
        assert {t["step"] for t in trajectories if t["step"] > 0} == set(range(1, steps + 1))

        events = client.get(f"/v1/runs/{run_id}/events").json()["items"]
        assert [e["to_status"] for e in events] == ["queued", "starting", "running", "succeeded"]
    assert retries(stack) > 0


def kill(stack: Stack, name: str) -> None:
    proc = stack.procs.pop(name)
    proc.kill()
    proc.wait(timeout=20)


def step_of(stack: Stack, run_id: str) -> int:
    try:
        with stack.client() as client:
            return int(client.get(f"/v1/runs/{run_id}").json()["current_step"])
    except httpx.HTTPError:
        return 0


def span_key(event: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one span from another: its track, name, start and length."""
    return (event["tid"], event["name"], event["ts"], event["dur"])


def all_trajectories(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/runs/{run_id}/trajectories", params=params).json()
        items += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return items
