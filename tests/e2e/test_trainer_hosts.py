"""``resources.hosts: 2`` through the API: the worker starts two trainer processes as Ray
actors (a local Ray cluster, real processes), one of them is SIGKILLed after the run's
first checkpoint, the attempt ends as a lost worker's, the next attempt resumes from the
checkpoint on two fresh trainer processes, and the run succeeds with final weights equal
(float32 tolerance, tests/rl_core/training/test_spmd.py) to the same spec on one process.

Sync mode on the tiny model is deterministic, resumes included
(tests/rl_core/pipeline/test_runner.py), so the two runs' final policies are comparable.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]

STEPS = 6
WEIGHT_TOL = 2e-5


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


def trainer_processes(data_dir: str) -> list[int]:
    """The Ray actor processes of this stack's worker (their environment names its data)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::TrainerProcess") and f"={data_dir}\0".encode() in env:
            pids.append(int(entry.name))
    return pids


def final_state(data_dir: str, run_id: str) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    folder = Path(data_dir) / "artifacts" / run_id / "checkpoints" / f"step-{STEPS:08d}"
    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
        restored = ckptr.restore(folder.absolute() / "state")
    return {name: np.asarray(value) for name, value in restored.items()}


@pytest.mark.timeout(900)
def test_two_trainer_processes_lose_one_resume_and_match_one_process(stack: Stack) -> None:
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

        one = post(1)
        final_one = wait_until(lambda: finished(one), 300, "the one-process run", stack)
        assert final_one["status"] == "succeeded", f"{final_one}\n{stack.dump_logs()}"
        for name in ("loss", "reward/mean"):
            got, want = (
                client.get(f"/v1/runs/{i}/metrics", params={"name": name}).json()["points"]
                for i in (two, one)
            )
            assert got[-1]["step"] == want[-1]["step"] == STEPS
            assert got[-1]["value"] == pytest.approx(want[-1]["value"], rel=1e-4), name

    want_state, got_state = final_state(data_dir, one), final_state(data_dir, two)
    assert want_state.keys() == got_state.keys()
    for name, value in want_state.items():
        np.testing.assert_allclose(got_state[name], value, atol=WEIGHT_TOL, rtol=0, err_msg=name)
