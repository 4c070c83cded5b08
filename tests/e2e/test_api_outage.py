"""The control plane goes away mid-run: the worker buffers its reports and loses none.

The API process is stopped for several seconds while the worker trains. The
worker's heartbeats and metric batches fail meanwhile; the batches wait in its
shipper under their sequence numbers and are sent when the API is back. The
run finishes, and every step's metrics are there exactly once.
"""

from __future__ import annotations

import time

import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]

OUTAGE_S = 8.0


def test_worker_buffers_through_an_api_outage(stack: Stack) -> None:
    stack.start_api()
    stack.start_worker()
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    # 12 steps: the outage starts at step 3, and the run must still be training after it.
    spec["train"]["steps"] = steps = 12

    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]

        def step_at_least(n: int) -> bool:
            return int(client.get(f"/v1/runs/{run_id}").json()["current_step"]) >= n

        wait_until(lambda: step_at_least(3), 240, "the run to reach step 3", stack)

    stack.stop("api")
    time.sleep(OUTAGE_S)  # the worker keeps training; its reports pile up
    # Down until the worker has tried to report into the outage and kept the batch: on
    # busy cores a step (a compile) can outlast a fixed outage, and nothing is tried.
    # Well within the lease (60 s), so the run stays with this worker.
    wait_until(lambda: "buffered" in worker_log(stack), 40, "the worker to buffer a report", stack)
    stack.start_api()

    with stack.client() as client:

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(finished, 300, f"run {run_id} to finish", stack)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["attempts"] == 1  # the outage was shorter than the lease: no re-enqueue

        for name in ("reward/mean", "loss"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, steps + 1)), name

    # The outage was real: the worker saw it and buffered.
    assert "buffered" in worker_log(stack), worker_log(stack)[-3000:]


def worker_log(stack: Stack) -> str:
    return (stack.logs / "worker.log").read_text(errors="replace")
