"""The demo spec as a user with preemptible workers runs it: its worker is SIGKILLed three
times, two steps apart, a fresh worker taking over each time. The spec says nothing about
checkpoints (they come by time, at an interval from their measured cost, and each attempt
writes one after its first step to measure it) nor about retries; the run succeeds, and its
final policy holds each step's update exactly once.

examples/tiny-game.yaml as it is but for ``train.steps`` (fewer, to fit CI). Each kill
comes on an event the test observes (not a clock): once the attempt has recorded a
checkpoint and trained two steps past the furthest step trained before it (steps 2, 4
and 6 of 8). So every attempt dies after progress, and the crash-loop rule
(app.services.crash_loop) queues the run again each time, and each next attempt resumes
from a checkpoint of the one before and trains again what that one had trained after it.
Async mode (the spec's own) is not reproducible step for step, so the check is the
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

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(3)]

APART = 2  # steps between kills
STEPS = 4 * APART  # three kills, then as many steps for the last attempt


# 144 s alone on idle cores, 465 s in a whole-suite run before the lease was 10 s (four
# attempts, each compiling before its first step): 600 s would be too tight when busier.
@pytest.mark.timeout(1500)
def test_a_worker_killed_three_times_trains_each_step_into_the_policy_once(
    private_stack: tuple[Stack, str],
) -> None:
    started = time.monotonic()
    stack, _ = private_stack
    stack.env.update(
        {
            # A killed worker's run is queued again about 10 s after its last beat (each
            # beat renews the lease for 10 s); ten beats to a lease, so a busy machine's
            # slow beat does not lose a live worker its run.
            "RLAAS_LEASE_SECONDS": "10",
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

        furthest = 0
        for attempt in (1, 2, 3):
            # A checkpoint of this attempt recorded, and APART steps past the furthest before.
            def progressed(attempt: int = attempt, target: int = furthest + APART) -> bool:
                now = run()
                saved = attempt in checkpoints().values()
                return bool(now["attempts"] == attempt and saved and now["current_step"] >= target)

            poll(before_the_end(progressed), 900, f"attempt {attempt} to progress", stack)
            kill(stack, f"worker-{attempt}", started)
            furthest = run()["current_step"]
            stack.start_worker(f"worker-{attempt + 1}")

        def finished() -> dict[str, Any] | None:
            now = run()
            return now if now["status"] in ("succeeded", "failed", "cancelled") else None

        final = wait_until(finished, 900, f"run {run_id} to finish", stack)
        print(f"{time.monotonic() - started:6.1f}s: the run {final['status']}")
        assert final["status"] == "succeeded", f"{final}\n{stack.dump_logs()}"
        assert final["attempts"] == 4

        lineage = client.get(f"/v1/runs/{run_id}/lineage").json()
        assert lineage["problems"] == [], lineage
        assert lineage["policy_step"] == STEPS and lineage["policy_attempt"] == 4
        steps = lineage["steps"]
        assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
        # Each step makes mini_batches x epochs optimiser updates (4 in the demo spec): a
        # step held twice in the policy would show as a count too high from then on.
        per_step = spec["algorithm"]["mini_batches"] * spec["algorithm"]["epochs"]
        assert [s["optimizer_updates"] for s in steps] == [
            per_step * n for n in range(1, STEPS + 1)
        ], steps
        # The progress survived each kill in a checkpoint the default cadence wrote: every
        # attempt's steps up to its checkpoint are in the final policy, and each later
        # attempt resumed from the one before it, not from the initial policy.
        bases = {
            s["attempt"]: s["base_attempt"] for s in steps if s["base_attempt"] != s["attempt"]
        }
        print(f"attempts in the final policy, each with the attempt it resumed from: {bases}")
        assert bases == {1: 0, 2: 1, 3: 2, 4: 3}, steps
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
