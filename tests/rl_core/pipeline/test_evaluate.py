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
        # One of four samples reached the threshold: the failed one's 9.0 is not a pass.
        "eval/pass@1": 0.25,
    }


def test_no_solved_share_when_the_environment_never_reports_one() -> None:
    assert "eval/solved" not in summarize([ended(1.0, "done")])


def test_the_held_out_seeds_are_not_training_seeds() -> None:
    training = {derive_seed(0, "env", i) for i in range(100_000)}
    held_out = {derive_seed(0, "eval", i) for i in range(1_000)}
    assert not training & held_out


def test_pass_at_k_takes_k_consecutive_samples_per_task() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0] + [0.0] * 4 + [1.0, 1.0, 0.5, 0.0]
    metrics = summarize([ended(r, "done") for r in rewards], k=4, pass_threshold=1.0)
    assert metrics["eval/pass@1"] == (1 / 4 + 0 + 2 / 4) / 3
    assert metrics["eval/pass@4"] == 2 / 3  # n = k: a task passes when any sample does
    assert metrics["eval/reward_mean"] == 3.5 / 12
    # The threshold decides what passes: at 0.5 the third task has three.
    assert (
        summarize([ended(r, "done") for r in rewards], k=4, pass_threshold=0.5)["eval/pass@1"]
        == (1 / 4 + 0 + 3 / 4) / 3
    )
