"""A run's worker is SIGKILLed three times at different points; a fresh worker takes over
each time. The run succeeds, its final policy holds each step's update exactly once, and its
parameters are those of an uninterrupted run of the same spec and seed.

The kills, each on an event the test observes (not a clock):

1. before the first checkpoint: once step 1's metrics are stored (its update is lost with
   the worker and step 1 is trained again from the initial policy);
2. mid-step: as soon as step 3's metrics are stored (and step 2's checkpoint recorded),
   while step 4's episodes are being played (step 3's update is lost and redone);
3. during or just after a checkpoint write: the moment the folder of step 6's checkpoint
   (or its temporary folder) appears on disk. Whether or not the API heard of it, the next
   attempt resumes from a checkpoint the API recorded and redoes what came after.

Four attempts in all, more than ``RLAAS_MAX_ATTEMPTS`` (3): the crash-loop guard counts only
attempts in a row that saved no checkpoint, and only the first did not.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.e2e.stack import REPO, Stack, rlaas, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(4)]

STEPS = 8
# The final parameters may differ from the uninterrupted run's by float32 rounding only:
# the rollout engine batches episodes as they come (continuous batching), so the sampler's
# log-probabilities of the same tokens differ in their last bits with the batch they were
# computed in (each process, and each attempt after a resume, batches differently), and the
# loss's importance weight pi_old / mu carries that into the gradient. Two uninterrupted runs
# differ as much (about 1e-7 after 15 steps; this test has seen up to 1.6e-6, Adam scaling
# the tiny differences of gradients near 0). One step's update moves the weights by about the
# learning rate (3e-3, Adam): a step missing or trained twice is 60 times the bound.
ATOL = 5e-5


def test_a_worker_killed_three_times_trains_each_step_into_the_policy_once(
    private_stack: tuple[Stack, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    stack, _ = private_stack
    stack.env.update(
        {
            "RLAAS_LEASE_SECONDS": "5",
            "RLAAS_HEARTBEAT_SECONDS": "1",
            # The test polls the run every 100 ms to kill inside a phase; not a tenant to limit.
            "RLAAS_QUOTA_REQUESTS_PER_MINUTE": "100000",
        }
    )
    spec = yaml.safe_load((REPO / "examples" / "tiny-game-short.yaml").read_text())
    spec["staleness"] = {"mode": "sync"}
    spec["train"].update({"steps": STEPS, "checkpoint_interval": 2, "seed": 3})
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))

    # The uninterrupted run, meanwhile, with no server: the parameters to match.
    reference = tmp_path / "reference"
    with (stack.logs / "reference.log").open("ab") as log:
        uninterrupted = subprocess.Popen(
            [*rlaas(), "train", str(spec_path), "--out", str(reference)],
            env=stack.env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    stack.start_api()
    stack.start_worker("worker-1")
    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]
        artifacts = Path(stack.env["RLAAS_DATA_DIR"]) / "artifacts" / run_id / "checkpoints"

        def run() -> dict[str, Any]:
            return dict(client.get(f"/v1/runs/{run_id}").json())

        def checkpoints() -> dict[int, int]:
            items = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
            return {c["step"]: c["attempt"] for c in items}

        # 1. Before the first checkpoint: step 1 trained, nothing saved.
        poll(lambda: run()["current_step"] >= 1, 300, "step 1 of attempt 1", stack)
        kill(stack, "worker-1", started)
        assert run()["current_step"] == 1 and checkpoints() == {}, "killed too late"
        stack.start_worker("worker-2")

        # 2. Mid-step: step 3 trained and step 2 saved, so step 4's episodes are being played.
        def step_3_done() -> bool:
            return run()["current_step"] >= 3 and 2 in checkpoints()

        poll(step_3_done, 300, "attempt 2 to train step 3", stack)
        kill(stack, "worker-2", started)
        assert run()["current_step"] == 3 and max(checkpoints()) == 2, "killed too late"
        stack.start_worker("worker-3")

        # 3. During or just after the write of step 6's checkpoint.
        def writing_step_6() -> str | None:
            if (artifacts / "step-00000006").exists():
                return "written"
            if any(artifacts.glob(".tmp-step-00000006-*")):
                return "writing"
            return None

        moment = poll(
            writing_step_6, 300, "attempt 3 to write step 6's checkpoint", stack, every_s=0.01
        )
        kill(stack, "worker-3", started)
        recorded = checkpoints()
        assert run()["attempts"] == 3 and 4 in recorded and max(recorded) <= 6, recorded
        stack.start_worker("worker-4")

        def finished() -> dict[str, Any] | None:
            now = run()
            return now if now["status"] in ("succeeded", "failed", "cancelled") else None

        final = wait_until(finished, 300, f"run {run_id} to finish", stack)
        print(f"{time.monotonic() - started:6.1f}s: the run {final['status']}")
        assert final["status"] == "succeeded", f"{final}\n{stack.dump_logs()}"
        assert final["attempts"] == 4

        lineage = client.get(f"/v1/runs/{run_id}/lineage").json()
        assert lineage["problems"] == [], lineage
        assert lineage["policy_step"] == STEPS and lineage["policy_attempt"] == 4
        steps = lineage["steps"]
        assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
        assert [s["optimizer_updates"] for s in steps] == list(range(1, STEPS + 1))
        # Attempt 4 resumed from the newest checkpoint the API had recorded: step 4's, or
        # step 6's if its record reached the API before the kill.
        resumed = min(s["base_step"] for s in steps if s["attempt"] == 4)
        assert resumed in (4, 6), resumed
        trained_by = [2, 2] + [3] * (resumed - 2) + [4] * (STEPS - resumed)
        assert [s["attempt"] for s in steps] == trained_by
        # The updates lost with a killed worker and trained again: attempt 1's step 1,
        # attempt 2's step 3, and attempt 3's steps after the checkpoint attempt 4 resumed
        # from (step 6's only if its metrics were stored before the kill).
        replaced = {s["step"]: s["replaced"] for s in steps}
        assert replaced[1] == [1] and replaced[3] == [2], replaced
        assert all(replaced[n] == [] for n in (2, 4, 7, 8)), replaced
        if resumed == 4:
            assert replaced[5] == [3] and replaced[6] in ([3], []), replaced

        for name in ("reward/mean", "loss"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, STEPS + 1)), name
        rewards = [
            p["value"]
            for p in client.get(
                f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"}
            ).json()["points"]
        ]
        final_uri = next(
            c["uri"]
            for c in client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
            if c["step"] == STEPS
        )

    assert uninterrupted.wait(timeout=300) == 0, stack.dump_logs()
    print(f"{time.monotonic() - started:6.1f}s: the uninterrupted run ended")
    # The same episodes were played and trained on: the same rewards, step by step.
    reference_rewards = [
        row["reward/mean"]
        for row in map(json.loads, (reference / "metrics.jsonl").read_text().splitlines())
    ]
    assert rewards == reference_rewards
    ours, theirs = (
        trainable(Path(final_uri)),
        trainable(reference / "checkpoints" / f"step-{STEPS:08d}"),
    )
    assert ours.keys() == theirs.keys()
    worst = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in ours)
    print(f"kill 3 came {moment}; largest parameter difference {worst:.3g}")
    assert worst <= ATOL, worst
    # And the bound is far below what updates move: the last two steps' (between the
    # uninterrupted run's checkpoints of steps 6 and 8) move the weights 40 times more at least.
    before = trainable(reference / "checkpoints" / f"step-{STEPS - 2:08d}")
    moved = max(float(np.max(np.abs(theirs[k] - before[k]))) for k in theirs)
    print(f"steps 7 and 8 moved the weights by up to {moved:.3g}")
    assert moved > 40 * ATOL, moved


def poll(
    check: Callable[[], Any], timeout_s: float, what: str, stack: Stack, every_s: float = 0.1
) -> Any:
    """``check`` every ``every_s`` until it answers: a step of this run takes seconds, so
    the kill lands well inside the phase it was aimed at."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        time.sleep(every_s)
    raise AssertionError(
        f"timed out after {timeout_s:.0f}s waiting for {what}\n{stack.dump_logs()}"
    )


def kill(stack: Stack, name: str, started: float) -> None:
    print(f"{time.monotonic() - started:6.1f}s: SIGKILL {name}")
    proc = stack.procs.pop(name)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=20)


def trainable(checkpoint: Path) -> dict[str, np.ndarray]:
    """The trainable weights of a checkpoint, by their dotted path, as float64."""
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as reader:
        state = reader.restore(checkpoint.absolute() / "state")
    return {k: np.asarray(v, np.float64) for k, v in state.items() if k.startswith("trainable.")}
