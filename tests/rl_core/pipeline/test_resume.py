"""The collector's position in a checkpoint: a resumed run neither skips nor repeats a task."""

from __future__ import annotations

from rl_core.host.control import RunControl

from .conftest import Behaviour, MemoryCheckpointer, RecordingTrainer, ScriptEnv, run_pipeline


def test_a_resumed_async_run_replays_unconsumed_tasks_and_repeats_none() -> None:
    control = RunControl()

    def plan(task: int, member: int, attempt: int) -> Behaviour:
        if task >= 9:
            control.request_stop()
        return Behaviour(delay_s=0.005 * (task % 3))

    saver = MemoryCheckpointer()
    first = run_pipeline(
        steps=20,
        max_staleness=1,
        env=ScriptEnv(plan),
        control=control,
        checkpointer=saver,
        checkpoint_interval=2,
        trainer=RecordingTrainer(delay_s=0.01),
    )
    assert first.result.stopped_early
    step = max(saver.saved)
    assert step == first.result.steps_completed  # the stop wrote the final checkpoint
    position = saver.saved[step]["collector"]
    before = [g.task.index for _, batch in first.trained() for g in batch]
    pending = {index for index, _ in position["pending"]}
    assert pending.isdisjoint(before)
    # Everything below next_index was trained, is pending, or was dropped by the staleness
    # gate (played too far behind the policy, as a loaded machine can make it: consumed,
    # never played again, by design); nothing else is skipped. A drop may also be the rest
    # of a split group whose first part was trained (``counts.split``), which skips no task:
    # so at most as many tasks are skipped as parts were dropped.
    assert set(before) | pending <= set(range(position["next_index"]))
    skipped = set(range(position["next_index"])) - set(before) - pending
    assert len(skipped) <= first.pipeline.queue.counts.dropped_stale, skipped

    second = run_pipeline(
        steps=step + 4,
        max_staleness=1,
        env=ScriptEnv(),
        start_step=step,
        position=position,
    )
    after = [g.task.index for _, batch in second.trained() for g in batch]
    assert [s for s, _ in second.sink.steps] == list(range(step + 1, step + 5))
    assert pending <= set(after)  # unconsumed work is played again
    assert set(after).isdisjoint(before)  # and nothing trained twice
    assert len(after) == len(set(after))
