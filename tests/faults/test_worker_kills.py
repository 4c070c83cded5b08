"""The demo spec as a user with preemptible workers runs it: its worker is SIGKILLed three
times, a few steps apart, a fresh worker taking over each time. The spec sets nothing about
checkpoints (they come by time, at an interval from their measured cost) and nothing about
retries; the run succeeds, and its final policy holds each step's update exactly once.

examples/tiny-game.yaml as it is but for ``train.steps`` (fewer, to fit CI). The kills,
each on an event the test observes (not a clock):

1. once step 2's metrics are stored: attempt 1 is taken before its first checkpoint
   (due 10 s after its first step);
2. two steps after attempt 2 recorded its first checkpoint: it is taken mid-run, and the
   next attempt resumes from that checkpoint and trains those two steps again;
3. two steps past the furthest step any attempt had trained: attempt 3 got further than
   ever before, but maybe saved no checkpoint of its own.

Four attempts in all, each dying after progress (a checkpoint or a step no attempt before
had reached), so the crash-loop rule (app.services.crash_loop) queues the run again each
time. Async mode (the spec's own) is not reproducible step for step, so the check is the
lineage: every step's update once in the final policy, each step's metrics once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.stack import REPO, Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(4)]

# Attempt 2's first checkpoint comes 10 s after its first step (the auto interval's floor):
# step ~12 at CI's ~0.8 s a step. Kill 3 then lands near step 16, and 30 leaves attempt 4
# steps to train after the checkpoint it resumes from.
STEPS = 30


def test_a_worker_killed_three_times_trains_each_step_into_the_policy_once(
    private_stack: tuple[Stack, str],
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
    spec = yaml.safe_load((REPO / "examples" / "tiny-game.yaml").read_text())
    assert "checkpoint_interval" not in spec["train"], "the demo spec's default is the point"
    spec["train"]["steps"] = STEPS
    stack.start_api()
    stack.start_worker("worker-1")
    with stack.client() as client:
        run_id = client.post("/v1/runs", json={"spec": spec}).json()["id"]

        def run() -> dict[str, Any]:
            return dict(client.get(f"/v1/runs/{run_id}").json())

        def checkpoints() -> dict[int, int]:
            items = client.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]
            return {c["step"]: c["attempt"] for c in items}

        def before_the_end(check: Callable[[], bool]) -> Callable[[], bool]:
            def checked() -> bool:
                now = run()
                assert now["status"] in ("queued", "starting", "running"), (
                    f"the run ended before the kill (lengthen it): {now}"
                )
                return check()

            return checked

        # 1. Step 2 trained, before the first checkpoint (due 10 s after step 1).
        poll(before_the_end(lambda: run()["current_step"] >= 2), 300, "step 2", stack)
        kill(stack, "worker-1", started)
        stack.start_worker("worker-2")

        # 2. Two steps after attempt 2's first checkpoint.
        def two_past_a_checkpoint_of_attempt_2() -> bool:
            saved = [step for step, attempt in checkpoints().items() if attempt == 2]
            return bool(saved) and run()["current_step"] >= max(saved) + 2

        poll(before_the_end(two_past_a_checkpoint_of_attempt_2), 300, "attempt 2", stack)
        kill(stack, "worker-2", started)
        furthest = run()["current_step"]
        stack.start_worker("worker-3")

        # 3. Two steps past the furthest step trained so far.
        def past_the_furthest() -> bool:
            now = run()
            return bool(now["attempts"] == 3 and now["current_step"] >= furthest + 2)

        poll(before_the_end(past_the_furthest), 300, "attempt 3 to go further", stack)
        kill(stack, "worker-3", started)
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
        # The progress survived the kills in checkpoints the default cadence wrote: attempt 4
        # resumed from one (not from the initial policy), and attempt 2's steps up to its
        # checkpoint are in the final policy.
        resumed = {s["attempt"]: s["base_step"] for s in steps if s["base_attempt"] != s["attempt"]}
        print(f"attempts in the final policy, and the step each resumed from: {resumed}")
        assert resumed[4] > 0 and 2 in resumed, resumed
        for name in ("reward/mean", "loss"):
            points = client.get(f"/v1/runs/{run_id}/metrics", params={"name": name}).json()
            assert [p["step"] for p in points["points"]] == list(range(1, STEPS + 1)), name


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
