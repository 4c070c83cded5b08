"""`build_batch`: episode credit gives a row one advantage, turn credit one per turn's tokens."""

from __future__ import annotations

import numpy as np

from rl_core.agent.ledger import Sample, Trajectory
from rl_core.pipeline.batch import build_batch
from rl_core.pipeline.queue import Group, GroupTask


def episode(member: int, turn_rewards: list[float]) -> Trajectory:
    """A prompt of 3 tokens, then per turn 2 model tokens and 1 observation token."""
    sample = Sample()
    sample.append_observation([1, 2, 3])
    for turn in range(len(turn_rewards)):
        sample.append_model([10 + turn, 20 + turn], [-0.5, -0.5], turn)
        sample.append_observation([4])
    return Trajectory(
        episode_id=f"e{member}",
        member=member,
        samples=[sample],
        reward=sum(turn_rewards),
        turn_rewards=turn_rewards,
        turns=len(turn_rewards),
        end_state="done",
    )


def group() -> Group:
    # Member 0 wins turn 1, member 1 wins turn 0; member 2 stops after one turn.
    members = [episode(0, [0.0, 1.0]), episode(1, [1.0, 0.0]), episode(2, [0.0])]
    return Group(task=GroupTask(0, 0), trajectories=members)


def model_advantages(batch_advantages: np.ndarray, mask: np.ndarray, row: int) -> list[float]:
    return [float(a) for a, m in zip(batch_advantages[row], mask[row], strict=False) if m]


def test_episode_credit_gives_every_token_of_a_row_its_episode_advantage() -> None:
    batch = build_batch([group()], group_size=3, rows=4, pad_id=0, scale_rewards=False)
    assert batch.advantages.shape == (4,)
    np.testing.assert_allclose(batch.advantages[:3], [1 / 3, 1 / 3, -2 / 3], atol=1e-6)


def test_turn_credit_gives_each_turns_tokens_that_turns_advantage() -> None:
    batch = build_batch(
        [group()], group_size=3, rows=4, pad_id=0, scale_rewards=False, credit="turn"
    )
    assert batch.advantages.shape == batch.tokens.shape
    # Turn 0: returns-to-go 1, 1, 0 (mean 2/3). Turn 1: members 0 and 1 only: 1, 0.
    expected = {0: [1 / 3, 1 / 3, 0.5, 0.5], 1: [1 / 3, 1 / 3, -0.5, -0.5], 2: [-2 / 3] * 2}
    for row, want in expected.items():
        np.testing.assert_allclose(
            model_advantages(batch.advantages, batch.loss_mask, row), want, atol=1e-6
        )
    assert not batch.advantages[batch.loss_mask == 0].any()  # prompts and observations: 0
