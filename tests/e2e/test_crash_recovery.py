"""A worker killed with SIGKILL mid-run: the run is re-enqueued and resumed from its checkpoint.

Worker A trains with a checkpoint every few steps and short leases. Once a
checkpoint is recorded it is killed outright (no cleanup, no final report).
Its lease expires, the reaper re-enqueues the run, worker B claims it, gets
the newest checkpoint in the claim, restores it and continues from the step
after it. The run succeeds with every step's metrics present exactly once:
no gap where A died, no step counted twice where B redid A's last steps.
"""

from __future__ import annotations

import signal

import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(6)]


def test_sigkilled_worker_is_replaced_and_the_run_resumes(stack: Stack) -> None:
    # Short leases so the reaper notices the dead worker within seconds.
    stack.env.update(
        {
            "RLAAS_LEASE_SECONDS": "6",
            "RLAAS_HEARTBEAT_SECONDS": "1",
            "RLAAS_REAPER_INTERVAL_S": "1",
        }
    )
    stack.start_api()
    worker_a = stack.start_worker("worker-a")
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["train"]["checkpoint_interval"] = 5
    steps = spec["train"]["steps"]

    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]

        def checkpointed() -> int:
            items = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
            return max((c["step"] for c in items), default=0)

        wait_until(lambda: checkpointed() >= 5, 300, "a first checkpoint", stack)
        killed_at = int(client.get(f"/v1/runs/{run_id}").json()["current_step"])
        worker_a.send_signal(signal.SIGKILL)
        worker_a.wait(timeout=10)
        stack.procs.pop("worker-a")
        assert killed_at < steps, "the run finished before the kill; lengthen it"
        # A is dead, so this list is final: B must resume from its newest entry.
        resumed = checkpointed()

        stack.start_worker("worker-b")

        def finished() -> dict[str, object] | None:
            run = client.get(f"/v1/runs/{run_id}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = wait_until(finished, 400, f"run {run_id} to finish", stack)
        assert run["status"] == "succeeded", f"{run}\n{stack.dump_logs()}"
        assert run["attempts"] == 2

        for name in ("reward/mean", "loss"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, steps + 1)), name

        events = client.get(f"/v1/runs/{run_id}/events").json()["items"]
        statuses = [e["to_status"] for e in events]
        # running -> queued is the reaper's re-enqueue after A's lease expired.
        assert statuses[:3] == ["queued", "starting", "running"]
        assert "queued" in statuses[3:] and statuses[-1] == "succeeded", statuses

        checkpoints = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
        assert max(c["step"] for c in checkpoints) == steps  # the final one, by worker B

    log_b = (stack.logs / "worker-b.log").read_text(errors="replace")
    assert f"resuming from step {resumed}" in log_b, log_b[-4000:]
