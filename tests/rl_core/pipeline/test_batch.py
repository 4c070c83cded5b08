"""`build_batch`: episode credit gives a row one advantage, turn credit one per turn's tokens."""

from __future__ import annotations

import functools

import numpy as np

from rl_core.agent.ledger import Sample, Trajectory
from rl_core.pipeline import configs
from rl_core.pipeline.batch import StragglerRewards, build_batch
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


def test_rows_carry_their_group_for_prefix_sharing() -> None:
    second = Group(task=GroupTask(1, 0), trajectories=[episode(0, [1.0]), episode(1, [0.0])])
    batch = build_batch([second, group()], group_size=3, rows=8, pad_id=0, scale_rewards=False)
    assert batch.groups is not None  # groups by task, padding rows in none
    assert batch.groups.tolist() == [0, 0, 0, 1, 1, -1, -1, -1]


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


def test_a_first_part_counts_its_missing_members_at_the_stragglers_recent_reward() -> None:
    # A group of 4 split: members 0 and 1 finished quickly (1.0, 0.5); 2 and 3 still run.
    first = Group(
        task=GroupTask(1, 0),
        trajectories=[episode(0, [1.0]), episode(1, [0.5])],
        part="first",
    )
    alone = build_batch([first], group_size=4, rows=2, pad_id=0, scale_rewards=False)
    np.testing.assert_allclose(alone.advantages, [0.25, -0.25], atol=1e-6)  # own mean
    # An earlier group's stragglers earned 0.0 and 0.5: the missing two count at 0.25.
    stragglers = StragglerRewards()
    rest = Group(
        task=GroupTask(0, 0),
        trajectories=[episode(0, [1.0]), episode(1, [1.0]), episode(2, [0.0]), episode(3, [0.5])],
        part="rest",
        train=frozenset({2, 3}),
    )
    assert stragglers.value is None
    stragglers.observe([rest, first])  # only a rest part's trained members are stragglers
    assert stragglers.value == 0.25
    batch = build_batch(
        [first], group_size=4, rows=2, pad_id=0, scale_rewards=False,
        straggler_reward=stragglers.value,
    )  # fmt: skip
    mean = (1.0 + 0.5 + 0.25 + 0.25) / 4
    np.testing.assert_allclose(batch.advantages, [1.0 - mean, 0.5 - mean], atol=1e-6)
    # A whole group, or the batch baseline, is unchanged by the estimate.
    whole = build_batch(
        [group()], group_size=3, rows=4, pad_id=0, scale_rewards=False, straggler_reward=9.0
    )
    np.testing.assert_allclose(whole.advantages[:3], [1 / 3, 1 / 3, -2 / 3], atol=1e-6)


def test_each_model_token_carries_its_policy_lag_behind_the_trainer() -> None:
    """Member 0's first turn was sampled by version 3 and its second by 5; the trainer
    holds 5 when the gate takes the group: lag 2 then 0, and 0 off the model's tokens."""
    g = group()
    for t, versions in zip(g.trajectories, ([3, 5], [5, 5], [4]), strict=True):
        t.turn_versions = versions
    assert build_batch([g], group_size=3, rows=4, pad_id=0, scale_rewards=False).lag is None
    g.trainer_version = 5  # set by the gate (GroupQueue.take)
    batch = build_batch([g], group_size=3, rows=4, pad_id=0, scale_rewards=False)
    assert batch.lag is not None and batch.lag.shape == batch.tokens.shape
    # Row: prompt 3, turn 0 (2 tokens), observation, turn 1 (2 tokens), observation.
    assert batch.lag[0, :9].tolist() == [0, 0, 0, 2, 2, 0, 0, 0, 0]
    assert not batch.lag[1].any()
    assert batch.lag[2, :5].tolist() == [0, 0, 0, 1, 1]
    assert not batch.lag[3].any()  # a padding row


def test_rows_pad_to_the_runs_length_bucket() -> None:
    # 3 + 32 turns x 3 tokens = 99 tokens: a power of two pads to 128, a quarter octave
    # to 112 (what the pipeline asks for: configs.TRAIN_LENGTH_BUCKET), both within 256.
    long = Group(task=GroupTask(0, 0), trajectories=[episode(0, [0.0] * 32)])
    build = functools.partial(
        build_batch, [long], group_size=1, rows=2, pad_id=0, scale_rewards=False, max_length=256
    )
    assert build().tokens.shape == (2, 128)
    fine = build(bucket=configs.TRAIN_LENGTH_BUCKET)
    assert fine.tokens.shape == (2, 112)
    assert fine.loss_mask[0].sum() == 64 and fine.loss_mask[0, 99:].sum() == 0
