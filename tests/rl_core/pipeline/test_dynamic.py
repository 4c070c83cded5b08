"""Dynamic sampling: groups of equal rewards dropped at the queue and replaced, within a cap."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rl_core.agent.ledger import Trajectory
from rl_core.host.control import RunControl
from rl_core.pipeline.configs import pipeline_config
from rl_core.pipeline.dynamic import DROPPED_EQUAL, EqualRewardScreen, carries_signal
from rl_core.pipeline.queue import Admission, Group, GroupPart, GroupQueue, GroupTask
from rl_core.spec import parse_spec

from .conftest import Behaviour, MemoryCheckpointer, RecordingTrainer, ScriptEnv, run_pipeline


def _group(
    rewards: list[float],
    *,
    part: GroupPart = "whole",
    turn_rewards: list[list[float]] | None = None,
    failed: tuple[int, ...] = (),
) -> Group:
    trajs = []
    for k, r in enumerate(rewards):
        t = Trajectory(episode_id=f"g0-e{k}", member=k, reward=r)
        t.turn_rewards = turn_rewards[k] if turn_rewards else [r]
        t.end_state = "env_error" if k in failed else "done"
        trajs.append(t)
    return Group(task=GroupTask(0), trajectories=trajs, part=part)


# --- the pure pieces ----------------------------------------------------------------


def test_a_group_carries_a_signal_when_its_kept_rewards_differ() -> None:
    assert not carries_signal(_group([1.0, 1.0, 1.0]))
    assert not carries_signal(_group([0.0, 0.0]))
    assert carries_signal(_group([0.0, 1.0, 0.0]))
    # Equal as the advantages see them (float32): a difference float32 cannot hold is none.
    assert not carries_signal(_group([0.1 + 0.2, 0.3]))
    # A failed member is not in the baseline: the two kept ones are alike.
    assert not carries_signal(_group([1.0, 0.0, 1.0], failed=(1,)))
    # A first part may be measured against the stragglers' estimate: never judged.
    assert carries_signal(_group([1.0, 1.0], part="first"))
    assert not carries_signal(_group([1.0, 1.0], part="rest"))
    # One kept member (group_size 1): it is its own mean, so its advantage is zero.
    assert not carries_signal(_group([1.0]))


def test_turn_credit_compares_the_rewards_of_each_turn() -> None:
    # Same episode reward, earned at different turns: the returns-to-go differ.
    moved = _group([1.0, 1.0], turn_rewards=[[1.0, 0.0], [0.0, 1.0]])
    assert carries_signal(moved, turn_credit=True)
    assert not carries_signal(moved)
    alike = _group([1.0, 1.0], turn_rewards=[[0.5, 0.5], [0.5, 0.5]])
    assert not carries_signal(alike, turn_credit=True)
    # Different lengths: the longer one took a turn the other did not.
    longer = _group([1.0, 1.0], turn_rewards=[[1.0], [1.0, 0.0]])
    assert carries_signal(longer, turn_credit=True)


def test_the_screen_drops_up_to_its_cap_per_step_and_marks_what_it_drops() -> None:
    screen = EqualRewardScreen(max_dropped=2)
    screen.begin_step()
    equal = [_group([1.0, 1.0]) for _ in range(3)]
    assert not screen.drops(_group([0.0, 1.0]))
    assert screen.drops(equal[0]) and screen.drops(equal[1])
    assert not screen.capped
    assert not screen.drops(equal[2])  # past the cap: trained as it is
    assert screen.capped
    assert screen.drain() == equal[:2]
    assert all(t.info["dropped"] == DROPPED_EQUAL for g in equal[:2] for t in g.trajectories)
    assert "dropped" not in equal[2].trajectories[0].info
    screen.begin_step()  # a new step, a new budget
    assert screen.drops(equal[2]) and not screen.capped


def test_the_queue_releases_a_dropped_group_so_another_may_start() -> None:
    async def main() -> None:
        admission = Admission(batch_groups=1, max_staleness=0, version=0, group_size=2)
        screen = EqualRewardScreen(max_dropped=10)
        queue = GroupQueue(
            admission=admission, policy="drop", requeue=lambda t: None, maxsize=8, screen=screen
        )
        screen.begin_step()
        await admission.acquire()
        assert not admission.may_start  # sync, one group a batch: its place is taken
        await queue.put(_group([1.0, 1.0]))
        signal = _group([0.0, 1.0])
        signal.task = GroupTask(1)
        async with asyncio.timeout(1):
            taker = asyncio.create_task(queue.take())
            await asyncio.sleep(0)
            # The equal group went back to admission: a new one may start in its place.
            assert admission.may_start and admission.consumed == 0 and admission.outstanding == 0
            await admission.acquire()
            await queue.put(signal)
            assert await taker is signal
        assert admission.consumed == 1 and admission.outstanding == 0
        assert [g.task for g in screen.drain()] == [GroupTask(0)]

    asyncio.run(main())


# --- runs -----------------------------------------------------------------------------


def _equal(task: int) -> bool:
    return task % 3 != 2  # two groups of three teach nothing


def _signal_plan(task: int, member: int, attempt: int) -> Behaviour:
    # Equal tasks alternate all-0 and all-1 groups; the others give 1 to member 0 only.
    if _equal(task):
        return Behaviour(reward=float(task % 2))
    return Behaviour(reward=float(member == 0))


def test_equal_groups_are_dropped_and_the_batch_refilled_with_signal() -> None:
    run = run_pipeline(
        mode="sync",
        steps=3,
        batch_groups=2,
        group_size=3,
        env=ScriptEnv(_signal_plan),
        drop_equal_groups=True,
        max_dropped_equal=100,
        trajectories_per_step=8,
    )
    assert run.result.steps_completed == 3
    # Sync: a step takes tasks in order until two carry a signal (admission lets one start
    # for each dropped), so the dropped ones are the equal tasks among them.
    signal = [t for t in range(100) if not _equal(t)]
    for step, batch in run.trained():
        assert len(batch) == 2 and all(len(g.kept) == 3 for g in batch)
        assert sorted(g.task.index for g in batch) == signal[2 * step - 2 : 2 * step]
    assert run.metrics("groups/dropped_equal") == [4.0, 4.0, 4.0]
    assert run.metrics("groups/dropped_equal_frac") == [4 / 6] * 3
    assert run.metrics("groups/trained_equal") == [0.0, 0.0, 0.0]
    # Every group the step took was played: its episodes count, dropped ones included.
    assert run.metrics("episode/done") == [18.0, 18.0, 18.0]
    assert run.metrics("reward/mean") == [1 / 3] * 3  # what the trainer got
    assert run.metrics("reward/drawn_mean") == [(6 + 2) / 18] * 3  # dropped ones too
    # Dropped episodes are reported, untrained, and say why.
    dropped = [r for r in run.sink.trajectories if r.info.get("dropped") == DROPPED_EQUAL]
    assert dropped and all(r.step == 0 for r in dropped)
    assert not any(seg.trained for r in dropped for seg in r.segments)
    assert all(_equal(r.group) for r in dropped)


def test_without_the_option_equal_groups_are_trained_and_counted() -> None:
    run = run_pipeline(mode="sync", steps=2, env=ScriptEnv(_signal_plan))
    tasks = [[g.task.index for g in batch] for _, batch in run.trained()]
    assert sorted(tasks[0]) == [0, 1] and sorted(tasks[1]) == [2, 3]
    assert run.metrics("groups/trained_equal") == [2.0, 1.0]
    assert run.metrics("groups/dropped_equal") == [0.0, 0.0]


def test_the_cap_holds_when_every_group_is_equal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rl_core.pipeline.pipeline"):
        run = run_pipeline(
            mode="sync",
            steps=3,
            env=ScriptEnv(lambda *_: Behaviour(reward=0.5)),
            drop_equal_groups=True,
            max_dropped_equal=3,
        )
    # The run ends: each step dropped its three, then trained what came.
    assert run.result.steps_completed == 3 and not run.result.stopped_early
    assert run.metrics("groups/dropped_equal") == [3.0, 3.0, 3.0]
    assert run.metrics("groups/trained_equal") == [2.0, 2.0, 2.0]
    assert run.metrics("groups/dropped_equal_frac") == [3 / 5] * 3
    assert [len(b) for _, b in run.trained()] == [2, 2, 2]
    capped = [r for r in caplog.records if "dynamic sampling dropped" in r.getMessage()]
    assert len(capped) == 3


def test_async_runs_drop_only_groups_without_signal() -> None:
    def plan(task: int, member: int, attempt: int) -> Behaviour:
        b = _signal_plan(task, member, attempt)
        b.delay_s = 0.002 * ((task * 7 + member * 3) % 5)  # stragglers, some groups split
        b.turns = 1 + (task + member) % 2
        return b

    run = run_pipeline(
        mode="async",
        steps=4,
        max_staleness=1,
        env=ScriptEnv(plan),
        trainer=RecordingTrainer(delay_s=0.01),
        drop_equal_groups=True,
        max_dropped_equal=100,
    )
    assert run.result.steps_completed == 4
    for _, batch in run.trained():
        assert sum(g.members for g in batch) >= 2 * 3  # the batch is full (parts may pass it)
        assert all(carries_signal(g) for g in batch)
    assert sum(run.metrics("groups/dropped_equal")) > 0
    assert run.metrics("groups/trained_equal") == [0.0] * 4


def test_a_resumed_run_neither_repeats_nor_skips_a_task() -> None:
    control = RunControl()

    def plan(task: int, member: int, attempt: int) -> Behaviour:
        if task >= 12:
            control.request_stop()
        b = _signal_plan(task, member, attempt)
        b.delay_s = 0.003 * (task % 3)
        return b

    saver = MemoryCheckpointer()
    # A group gone stale is played again (policy requeue), so every task's fate is its
    # rewards'.
    first = run_pipeline(
        steps=20,
        env=ScriptEnv(plan),
        control=control,
        checkpointer=saver,
        checkpoint_interval=2,
        trainer=RecordingTrainer(delay_s=0.01),
        drop_equal_groups=True,
        max_dropped_equal=100,
        policy="requeue",
    )
    assert first.result.stopped_early
    step = max(saver.saved)
    second = run_pipeline(
        steps=step + 4,
        env=ScriptEnv(_signal_plan),
        start_step=step,
        position=saver.saved[step]["collector"],
        drop_equal_groups=True,
        max_dropped_equal=100,
        policy="requeue",
    )
    position = saver.saved[step]["collector"]
    # A group split around its stragglers trains as two parts (first, rest): one task. A
    # first part is never judged (dynamic.py), so count the parts that end a group.
    trained = [
        g.task.index
        for run in (first, second)
        for _, batch in run.trained()
        for g in batch
        if g.part != "first"
    ]
    assert len(trained) == len(set(trained))  # none twice
    assert not any(_equal(t) for t in trained)  # none without a signal
    # None skipped: every task with a signal that the first run had started was trained.
    assert {t for t in range(position["next_index"]) if not _equal(t)} <= set(trained)


def test_the_spec_reaches_the_pipeline() -> None:
    spec = parse_spec(
        {
            "environment": {"name": "guess_number"},
            "algorithm": {
                "batch_groups": 4,
                "credit": "turn",
                "dynamic_sampling": {"enabled": True},
            },
        }
    )
    config = pipeline_config(spec)
    assert config.drop_equal_groups and config.turn_credit
    assert config.max_dropped_equal == 16
    assert not pipeline_config(
        parse_spec({"environment": {"name": "guess_number"}})
    ).drop_equal_groups
