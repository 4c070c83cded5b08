"""The evaluator's summary, and its fixed held-out set, on hand-made trajectories."""

from __future__ import annotations

from rl_core.agent.ledger import Trajectory
from rl_core.pipeline.collector import derive_seed
from rl_core.pipeline.evaluate import summarize


def ended(reward: float, state: str, **info: object) -> Trajectory:
    t = Trajectory(episode_id="e", reward=reward, turns=2, info=dict(info))
    t.end(state, None)  # type: ignore[arg-type]
    return t


def test_summary_leaves_failed_episodes_out_of_the_means() -> None:
    metrics = summarize(
        [
            ended(1.0, "done", solved=True),
            ended(0.0, "truncated"),
            ended(0.5, "done", solved=False),
            ended(9.0, "env_error"),
        ]
    )
    assert metrics == {
        "eval/reward_mean": 0.5,
        "eval/turns_mean": 2.0,
        "eval/episodes": 3.0,
        "eval/failed": 1.0,
        "eval/solved": 1 / 3,
    }


def test_no_solved_share_when_the_environment_never_reports_one() -> None:
    assert "eval/solved" not in summarize([ended(1.0, "done")])


def test_the_held_out_seeds_are_not_training_seeds() -> None:
    training = {derive_seed(0, "env", i) for i in range(100_000)}
    held_out = {derive_seed(0, "eval", i) for i in range(1_000)}
    assert not training & held_out
