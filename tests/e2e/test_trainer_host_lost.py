"""A lost trainer process, through the API: with ``resources.hosts: 2`` the worker starts
two trainer processes as Ray actors (a local Ray cluster, real processes); one of them is
SIGKILLed after the run's first checkpoint, the attempt ends as a lost worker's (no
failure reported: the lease lapses, the reaper queues the run again), the next attempt
resumes from the checkpoint on two fresh trainer processes, and the run succeeds with
every trainer process of both attempts gone at the end.

That the weights of a two-process run equal a one-process run's is
tests/e2e/test_trainer_hosts.py's (with a rollout fleet); that a two-process checkpoint
resumes to the same step is tests/rl_core/pipeline/test_hosts.py's. Here: the path from
a dead process to a resumed run, on the tiny model and the JAX engine.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.e2e.stack import Stack, wait_until
from tests.e2e.test_trainer_hosts import trainer_processes

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(2)]

STEPS = 6


def spec(hosts: int) -> dict[str, Any]:
    return {
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 4, "max_turns": 2}},
        "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 64},
        "rollout": {"group_size": 4, "concurrency": 8},
        "algorithm": {"batch_groups": 2, "learning_rate": 1e-3},
        "staleness": {"mode": "sync"},
        "train": {"steps": STEPS, "seed": 0, "checkpoint_interval": 1},
        "resources": {"hosts": hosts},
    }


@pytest.mark.timeout(900)
def test_a_lost_trainer_process_ends_the_attempt_and_the_run_resumes(stack: Stack) -> None:
    stack.env.update(
        {
            "RLAAS_LEASE_SECONDS": "10",  # the killed attempt's run is queued again soon
            "RLAAS_HEARTBEAT_SECONDS": "1",
            "RLAAS_TRAINER_CALL_TIMEOUT_S": "120",
        }
    )
    data_dir = stack.env["RLAAS_DATA_DIR"]
    stack.start_api()
    stack.start_worker()
    with stack.client() as client:

        def post(hosts: int) -> str:
            r = client.post("/v1/runs", json={"spec": spec(hosts)})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        def run(run_id: str) -> dict[str, Any]:
            return dict(client.get(f"/v1/runs/{run_id}").json())

        def finished(run_id: str) -> dict[str, Any] | None:
            now = run(run_id)
            return now if now["status"] in ("succeeded", "failed", "cancelled") else None

        two = post(2)

        def checkpointed() -> list[int] | None:
            now = run(two)
            assert now["status"] in ("queued", "starting", "running"), now
            items = client.get(f"/v1/runs/{two}/checkpoints").json()["items"]
            pids = trainer_processes(data_dir)
            return pids if items and now["current_step"] < STEPS - 1 and len(pids) == 2 else None

        pids = wait_until(checkpointed, 300, "a checkpoint of the two-process run", stack)
        os.kill(pids[1], signal.SIGKILL)
        final = wait_until(lambda: finished(two), 400, "the run to resume and finish", stack)
        assert final["status"] == "succeeded", f"{final}\n{stack.dump_logs()}"
        assert final["attempts"] == 2, final
        log = (stack.logs / "worker.log").read_text(errors="replace")
        assert "a trainer process was lost; the attempt ends" in log, stack.dump_logs()
        # The first attempt's trainer processes were stopped, the second's at its end.
        deadline = time.monotonic() + 30
        while trainer_processes(data_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert trainer_processes(data_dir) == []
        # Resumed, not restarted: the optimiser's count after the last step holds each
        # step's update once (docs/lifecycle.md, lineage).
        updates = client.get(
            f"/v1/runs/{two}/metrics", params={"name": "optimizer_updates"}
        ).json()["points"]
        assert updates[-1]["step"] == STEPS and updates[-1]["value"] == STEPS, updates[-3:]
