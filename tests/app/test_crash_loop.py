"""The crash-loop rule as a pure function: preempted runs that advance go on, runs that die
at the same place every time fail with the reason (app.services.crash_loop)."""

from __future__ import annotations

import pytest

from app.services.crash_loop import AttemptRecord, Policy, decide, progress
from app.settings import Settings

POLICY = Policy(crash_loop_attempts=3, attempt_budget=10, backoff_s=5.0, backoff_max_s=60.0)


def attempts(*ends: tuple[int | None, bool]) -> list[AttemptRecord]:
    """Attempts 1.. from (furthest trained step or None, saved a checkpoint)."""
    return [
        AttemptRecord(number=n, trained_to=to, saved_checkpoint=saved)
        for n, (to, saved) in enumerate(ends, start=1)
    ]


def test_workers_taken_away_while_training_further_each_time_queue_the_run_again() -> None:
    # No checkpoint at all (killed 4 steps apart before any was due): each attempt still
    # got further than the one before, so each death is a preemption.
    run = attempts((4, False), (8, False), (12, False))
    assert progress(run) == [True, True, True]
    verdict = decide(run, POLICY)
    assert verdict.requeue and verdict.delay_s == 5.0


def test_a_checkpoint_is_progress_even_short_of_the_furthest_step() -> None:
    # Attempt 2 resumed from an early checkpoint and died before step 9, but saved step 6.
    run = attempts((9, False), (7, True), (9, False), (9, False))
    assert progress(run) == [True, True, False, False]
    verdict = decide(run, POLICY)
    assert verdict.requeue and verdict.delay_s == 20.0  # 5 s doubled per stalled attempt


def test_dying_at_the_same_place_three_times_in_a_row_fails_with_the_reason() -> None:
    run = attempts((5, True), (7, False), (7, False), (7, False), (7, False))
    assert progress(run) == [True, True, False, False, False]
    # Two stalled attempts: not yet.
    assert decide(run[:4], POLICY).requeue
    verdict = decide(run, POLICY)
    assert not verdict.requeue and verdict.reason is not None
    assert verdict.reason.startswith("crash loop: the worker died on 3 attempts in a row")
    assert "without getting past step 7" in verdict.reason
    assert "attempt 5 died after step 7" in verdict.reason


def test_a_worker_that_dies_before_its_first_step_every_time_is_a_crash_loop() -> None:
    run = attempts((None, False), (None, False), (None, False))
    verdict = decide(run, POLICY)
    assert not verdict.requeue and verdict.reason is not None
    assert "attempt 1 trained no step" in verdict.reason


def test_the_attempt_budget_bounds_a_run_that_keeps_progressing() -> None:
    run = attempts(*[(2 * n, False) for n in range(1, 11)])
    assert all(progress(run))
    verdict = decide(run, POLICY)
    assert not verdict.requeue and verdict.reason is not None
    assert "RLAAS_RUN_ATTEMPT_BUDGET" in verdict.reason
    assert decide(run, Policy(attempt_budget=0)).requeue  # 0: no bound


def test_the_backoff_is_capped() -> None:
    run = attempts((9, True), (None, False), (None, False))
    big = Policy(crash_loop_attempts=10, backoff_s=40.0, backoff_max_s=60.0)
    assert decide(run, big).delay_s == 60.0


def test_the_operator_sets_the_policy_and_the_old_name_is_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().requeue_policy() == Policy()  # the defaults documented in lifecycle.md
    monkeypatch.setenv("RLAAS_MAX_ATTEMPTS", "5")  # the name before
    assert Settings().requeue_policy().crash_loop_attempts == 5
    for name, value in {
        "RLAAS_CRASH_LOOP_ATTEMPTS": "4",
        "RLAAS_RUN_ATTEMPT_BUDGET": "50",
        "RLAAS_REQUEUE_BACKOFF_S": "2",
        "RLAAS_REQUEUE_BACKOFF_MAX_S": "60",
    }.items():
        monkeypatch.setenv(name, value)
    assert Settings().requeue_policy() == Policy(
        crash_loop_attempts=4, attempt_budget=50, backoff_s=2.0, backoff_max_s=60.0
    )
