"""Sync and async modes, the reports of every step, stop and cancellation."""

from __future__ import annotations

import threading

from rl_core.host.control import RunControl
from rl_core.pipeline.queue import Group
from rl_core.records import STAGES

from .conftest import (
    Behaviour,
    MemoryCheckpointer,
    RecordingTrainer,
    ScriptEnv,
    parse_id,
    run_pipeline,
)


def test_sync_and_async_both_train_every_step() -> None:
    for mode in ("sync", "async"):
        run = run_pipeline(mode=mode, steps=3, env=ScriptEnv(lambda *_: Behaviour(turns=2)))
        assert run.result.steps_completed == 3 and not run.result.stopped_early, mode
        assert [s for s, _ in run.sink.steps] == [1, 2, 3]
        for _, batch in run.trained():
            assert len(batch) == 2  # batch_groups
            assert all(len(g.kept) == 3 for g in batch)
        if mode == "sync":
            assert set(run.metrics("staleness/max")) == {0.0}


def test_sync_mode_plays_each_batch_with_the_policy_it_trains() -> None:
    run = run_pipeline(mode="sync", steps=4, trainer=RecordingTrainer(delay_s=0.02))
    for step, batch in run.trained():
        assert {t.policy_version for g in batch for t in g.trajectories} == {step - 1}


def test_async_overlaps_collection_with_a_slow_trainer() -> None:
    # With the trainer slower than the environment, the next batch is played
    # while it computes: episodes of version v-1 are consumed at version v.
    run = run_pipeline(
        mode="async", steps=5, max_staleness=1, trainer=RecordingTrainer(delay_s=0.05)
    )
    assert max(run.metrics("staleness/max")) == 1.0
    assert sum(run.metrics("staleness/bucket_1")) > 0


def test_every_step_reports_metrics_spans_and_trajectories() -> None:
    run = run_pipeline(steps=3, env=ScriptEnv(lambda *_: Behaviour(turns=2, reward=0.5)))
    for _, m in run.sink.steps:
        for name in (
            "reward/mean",
            "loss",
            "kl",
            "entropy",
            "clip_frac",
            "grad_norm",
            "learning_rate",
            "mismatch_kl",
            "tokens_per_s",
            "trajectories_per_s",
            "queue/depth",
            "staleness/mean",
            "staleness/max",
            "staleness/bucket_0",
            "trainer/busy_frac",
            "trainer/blocked_frac",
            "trainer/idle_frac",
            "engine/busy_frac",
            "engine/blocked_frac",
            "engine/idle_frac",
            "failures/total",
            "loop/lag_ms_max",
            "time/train_step_s",
        ):
            assert name in m, name
        assert m["reward/mean"] == 0.5
        fracs = m["trainer/busy_frac"] + m["trainer/blocked_frac"] + m["trainer/idle_frac"]
        assert abs(fracs - 1.0) < 1e-9
    names = {s.name for s in run.sink.spans}
    assert (
        {"rollout", "model_call", "env_step", "reward", "queue_wait", "train_step", "weight_sync"}
        <= names
        <= set(STAGES)
    )
    assert {s.step for s in run.sink.spans if s.name == "train_step"} == {1, 2, 3}
    # trajectories_per_step=2 trained episodes each step, one from each of its two groups.
    for step in (1, 2, 3):
        trained = [t for t in run.sink.trajectories if t.step == step]
        assert len(trained) == 2 and len({t.group for t in trained}) == 2
    record = run.sink.trajectories[0]
    assert record.step == 1 and record.end_state == "done" and record.turns == 2
    assert [s.trained for s in record.segments] == [False, True, False, True]
    assert run.control.inflight() is not None


def test_stop_lands_on_a_step_boundary_and_cancels_what_is_in_flight() -> None:
    control = RunControl()
    stop_at = threading.Event()

    def plan(task: int, member: int, attempt: int) -> Behaviour:
        if task >= 6:  # the episodes of step 3 onwards: slow, so they are in flight at the stop
            stop_at.set()
            control.request_stop()
            return Behaviour(turns=5, delay_s=0.5)
        return Behaviour()

    env = ScriptEnv(plan)
    run = run_pipeline(steps=10, mode="sync", env=env, control=control)
    assert stop_at.is_set()
    assert run.result.stopped_early and run.result.steps_completed == 3
    cancelled = [t for t in run.sink.trajectories if t.end_state == "cancelled"]
    assert cancelled and all(t.end_reason == "cancelled" for t in cancelled)
    assert all(parse_id(t.episode_id)[0] >= 6 for t in cancelled)
    assert set(env.resets) == set(env.closed)  # every episode closed, cancelled ones too
    assert run.pipeline.collector.inflight == {}


class AbortingTrainer(RecordingTrainer):
    """Its ``abort_at``-th update is in the device thread when the host aborts (the worker
    heard that the control plane refused a report: another worker holds the run)."""

    def __init__(self, control: RunControl, abort_at: int) -> None:
        super().__init__()
        self.control, self.abort_at = control, abort_at

    def train_step(self, groups: list[Group]) -> dict[str, float]:
        if self.updates + 1 == self.abort_at:
            self.control.abort()
        return super().train_step(groups)


def test_an_abort_trains_no_further_step_and_writes_and_reports_nothing_more() -> None:
    control = RunControl()
    checkpointer = MemoryCheckpointer()
    run = run_pipeline(
        steps=10,
        mode="sync",
        control=control,
        trainer=AbortingTrainer(control, abort_at=3),
        checkpointer=checkpointer,
        checkpoint_interval=1,
    )
    assert run.result.stopped_early and run.result.steps_completed == 2
    # Step 3's update (made when the abort came) is neither reported nor checkpointed, and
    # no final checkpoint follows: it would be written where the run's holder writes.
    assert [step for step, _ in run.sink.steps] == [1, 2]
    assert sorted(checkpointer.saved) == [1, 2]
    assert all(t.step <= 2 and t.end_state != "cancelled" for t in run.sink.trajectories)
