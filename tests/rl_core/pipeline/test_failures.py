"""Infrastructure failures leave the batch, counted by reason; no group is trained partially."""

from __future__ import annotations

import pytest

from rl_core.agent.agent import AgentConfig
from rl_core.errors import EnvironmentFailure, NoTrajectories

from .conftest import Behaviour, ScriptEnv, run_pipeline


def one_failure_per_group(task: int, member: int, attempt: int) -> Behaviour:
    return Behaviour(fail=member == 0, reward=float(member))


def test_failed_episodes_leave_the_group_and_are_counted_never_scored() -> None:
    run = run_pipeline(steps=3, group_size=3, env=ScriptEnv(one_failure_per_group))
    for _, batch in run.trained():
        for group in batch:
            assert [t.member for t in group.kept] == [1, 2]
            assert [t.end_state for t in group.trajectories if not t.kept] == ["env_error"]
    for _, m in run.sink.steps:
        assert m["reward/min"] == 1.0  # the failed member (reward 0) was never averaged in
        assert m["episode/trained"] == 4
    assert sum(run.metrics("failures/env_step")) >= 6
    assert sum(run.metrics("episode/env_error")) >= 6
    failed = [t for t in run.sink.trajectories if t.end_state == "env_error"]
    assert failed and "webhook down" in failed[0].info["error"] and failed[0].step == 0
    # Its model text is there to read, and none of it reads as trained: none was.
    assert all(t.model_tokens and t.segments for t in failed)
    assert not any(s.trained for t in failed for s in t.segments)


def test_a_group_left_with_fewer_than_two_episodes_is_dropped_whole() -> None:
    def plan(task: int, member: int, attempt: int) -> Behaviour:
        # Even tasks lose two of three episodes: one survivor has no group baseline.
        return Behaviour(fail=task % 2 == 0 and member > 0)

    run = run_pipeline(steps=3, group_size=3, env=ScriptEnv(plan))
    trained = [g for _, batch in run.trained() for g in batch]
    assert trained and all(g.task.index % 2 == 1 for g in trained)
    assert all(len(g.kept) == 3 for g in trained)
    assert sum(run.metrics("groups/dropped_failed")) >= 3


def test_timeouts_remove_episodes_by_reason() -> None:
    def plan(task: int, member: int, attempt: int) -> Behaviour:
        return Behaviour(delay_s=10.0 if member == 0 else 0.0)

    run = run_pipeline(
        steps=2,
        group_size=3,
        env=ScriptEnv(plan),
        episode_timeout_s=None,
        agent=AgentConfig(max_turns=4, max_new_tokens=4, env_timeout_s=0.05),
    )
    assert sum(run.metrics("failures/env_timeout")) >= 4
    assert sum(run.metrics("episode/timeout")) >= 4
    run = run_pipeline(steps=2, group_size=3, env=ScriptEnv(plan), episode_timeout_s=0.05)
    assert sum(run.metrics("failures/episode_timeout")) >= 4
    for _, batch in run.trained():
        assert all(len(g.kept) == 2 for g in batch)


def test_an_environment_that_always_fails_fails_the_run_with_its_error() -> None:
    env = ScriptEnv(lambda *_: Behaviour(fail=True))
    with pytest.raises(EnvironmentFailure, match="webhook down"):
        run_pipeline(steps=2, env=env)


def test_a_run_whose_episodes_all_time_out_says_what_to_raise() -> None:
    env = ScriptEnv(lambda *_: Behaviour(delay_s=10.0))
    with pytest.raises(NoTrajectories, match="episode_timeout_s"):
        run_pipeline(steps=2, env=env, episode_timeout_s=0.02)
