"""PostgreSQL restarts under a live run: the API says 503 with Retry-After while it is
down, recovers without a restart of its own, the SDK's reads and its live stream carry
on through the outage, and the worker's reports arrive once each.

The deployment has a PostgreSQL server of its own (conftest.py), stopped with
``pg_ctl stop -m fast`` once the run has trained a few steps and started again on the
same port once the worker has had a report refused.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from sdk.client import Client
from tests.e2e.stack import REPO, Stack, wait_until
from tests.faults.conftest import finished, retries, services

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]


def test_a_database_restart_answers_503_and_loses_no_report(
    private_stack: tuple[Stack, str],
) -> None:
    stack, folder = private_stack
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    # 12 steps: the outage starts at step 3, and the run must still be training after it.
    spec["train"]["steps"] = steps = 12

    with (
        stack.client() as client,
        Client(stack.api_url, stack.api_key) as sdk_client,
        Client(stack.api_url, stack.api_key) as streaming,
        ThreadPoolExecutor(2) as pool,
    ):
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]
        # A live metrics stream open across the outage (it reconnects by itself).
        streamed = pool.submit(lambda: [m.step for m in streaming.iter_metrics(run_id)])

        def step_at_least(n: int) -> bool:
            return int(client.get(f"/v1/runs/{run_id}").json()["current_step"]) >= n

        wait_until(lambda: step_at_least(3), 240, "the run to reach step 3", stack)

        retried_before = retries(stack)
        services("pg-stop", folder)
        down_since = time.monotonic()
        answer = client.get(f"/v1/runs/{run_id}")
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "2"
        error = answer.json()["error"]
        assert error["code"] == "unavailable" and "database" in error["message"]
        assert "Traceback" not in answer.text and "psycopg" not in answer.text
        assert httpx.get(f"{stack.api_url}/readyz", timeout=5).status_code == 503
        # The SDK's reads wait through it, as Retry-After says.
        waiting = pool.submit(lambda: sdk_client.get_run(run_id))
        # Down until the worker has had a report refused and kept it (well within the
        # 60 s lease, so the run stays with this worker).
        wait_until(
            lambda: retries(stack) > retried_before,
            60,
            "the worker to retry a report against the outage",
            stack,
        )
        # Down for longer than one Retry-After, so the SDK's read has to retry at
        # least once (the worker's retry alone can come within a fraction of a second).
        time.sleep(max(0.0, 3.0 - (time.monotonic() - down_since)))
        assert not waiting.done(), "the SDK's read returned during the outage"
        services("pg-start", folder)
        assert waiting.result(timeout=60).id == run_id

        # The same API process answers again: its pool reconnects by itself.
        wait_until(
            lambda: client.get(f"/v1/runs/{run_id}").status_code == 200,
            30,
            "the API to answer again after the database came back",
            stack,
        )

        run = finished(stack, client, run_id)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["attempts"] == 1, "the outage was shorter than the lease"
        assert "api" in stack.procs and stack.procs["api"].poll() is None  # never restarted

        assert streamed.result(timeout=60) == list(range(1, steps + 1))
        for name in ("reward/mean", "loss"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, steps + 1)), name
        # Spans are stored once per batch: a retried batch would show a step twice.
        trace = client.get(f"/v1/runs/{run_id}/timeline", params={"limit": 100_000}).json()
        train = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == "train_step"]
        assert len(train) == steps, [e["args"] for e in train]
        events = client.get(f"/v1/runs/{run_id}/events").json()
        assert [e["to_status"] for e in events["items"]] == [
            "queued",
            "starting",
            "running",
            "succeeded",
        ]


@pytest.mark.minutes(1)
def test_a_post_while_the_database_is_down_answers_503_not_500(
    private_stack: tuple[Stack, str],
) -> None:
    """A request with a body reads its tenant's body limit in a middleware, before any
    route (app/api/body_limit.py), where the app's 503 handler does not reach: found by
    bench/l1_tenants.py as a bare 500 on POST /v1/runs/{id}/sessions during a restart."""
    stack, folder = private_stack
    stack.start_api()  # a fresh process: no tenant's limit is cached yet
    services("pg-stop", folder)
    try:
        with stack.client() as client:
            for path in ("/v1/runs", "/v1/runs/run_0/sessions"):
                answer = client.post(path, json={"spec": {}})
                assert answer.status_code == 503, f"{path}: {answer.text}"
                assert answer.headers["Retry-After"] == "2"
                error = answer.json()["error"]
                assert error["code"] == "unavailable" and "database" in error["message"]
    finally:
        services("pg-start", folder)
    with stack.client() as client:  # and the limit is read once the database is back
        wait_until(
            lambda: client.post("/v1/runs", json={"spec": {}}).status_code == 422,
            30,
            "the API to answer again after the database came back",
            stack,
        )
