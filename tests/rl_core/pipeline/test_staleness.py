"""The staleness bound, admission control, and the drop/requeue policy for stragglers."""

from __future__ import annotations

import pytest

from .conftest import Behaviour, RecordingTrainer, ScriptEnv, parse_id, run_pipeline, seeded_delays


@pytest.mark.parametrize(
    ("seed", "max_staleness", "batch_groups", "group_size", "policy", "trainer_s"),
    [
        (0, 0, 2, 2, "drop", 0.0),
        (1, 1, 2, 3, "drop", 0.01),
        (2, 1, 3, 2, "requeue", 0.0),
        (3, 2, 2, 2, "requeue", 0.02),
        (4, 3, 1, 4, "drop", 0.005),
        (5, 2, 4, 2, "drop", 0.0),
    ],
)
def test_trained_data_is_never_staler_than_the_bound(
    seed: int,
    max_staleness: int,
    batch_groups: int,
    group_size: int,
    policy: str,
    trainer_s: float,
) -> None:
    run = run_pipeline(
        steps=6,
        batch_groups=batch_groups,
        group_size=group_size,
        max_staleness=max_staleness,
        policy=policy,
        env=ScriptEnv(seeded_delays(seed, 0.03)),
        trainer=RecordingTrainer(delay_s=trainer_s),
    )
    assert run.result.steps_completed == 6
    for step, batch in run.trained():
        assert len(batch) == batch_groups
        for group in batch:
            for t in group.kept:
                assert 0 <= (step - 1) - t.policy_version <= max_staleness
    # Admission: started-but-unconsumed work never passed what the bound allows.
    assert run.pipeline.admission.peak_outstanding <= (max_staleness + 1) * batch_groups
    assert max(run.metrics("staleness/max")) <= max_staleness
    for _, m in run.sink.steps:
        buckets = sum(m[f"staleness/bucket_{k}"] for k in range(max_staleness + 1))
        assert buckets == batch_groups
    # No task trained twice.
    tasks = [g.task.index for _, batch in run.trained() for g in batch]
    assert len(tasks) == len(set(tasks))


def straggler(task: int, member: int, attempt: int) -> Behaviour:
    # Task 0's first attempt is slow enough to be overtaken by two batches of others.
    if task == 0 and attempt == 0:
        return Behaviour(delay_s=0.25)
    return Behaviour(delay_s=0.01)


def test_a_stale_straggler_is_dropped_never_trained() -> None:
    run = run_pipeline(
        steps=12,
        max_staleness=1,
        policy="drop",
        env=ScriptEnv(straggler),
        trainer=RecordingTrainer(delay_s=0.03),
    )
    trained = {g.task.index for _, batch in run.trained() for g in batch}
    assert 0 not in trained
    assert sum(run.metrics("groups/dropped_stale")) == 1
    assert sum(run.metrics("groups/requeued")) == 0


def test_a_stale_straggler_is_requeued_and_replayed_under_a_fresh_policy() -> None:
    run = run_pipeline(
        steps=12,
        max_staleness=1,
        policy="requeue",
        env=ScriptEnv(straggler),
        trainer=RecordingTrainer(delay_s=0.03),
    )
    replayed = [(step, g) for step, batch in run.trained() for g in batch if g.task.index == 0]
    assert len(replayed) == 1
    step, group = replayed[0]
    assert group.task.attempt == 1
    assert all(parse_id(t.episode_id)[2] == 1 for t in group.trajectories)
    assert all((step - 1) - t.policy_version <= 1 for t in group.kept)
    assert sum(run.metrics("groups/requeued")) == 1
    assert sum(run.metrics("groups/dropped_stale")) == 0
