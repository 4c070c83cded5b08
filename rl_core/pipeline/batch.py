"""From consumed groups to the trainer's padded `TrainBatch` (runs in the device thread).

Advantages are GRPO's, over each group's surviving episodes. With episode
credit (the default) every training sample of an episode (more than one when
the template rewrote history) gets the episode's advantage; with turn credit
each model token gets the advantage of its turn (`turn_credit`). Each row keeps
its episode's reward (PPO's trainer ignores the advantage
and runs GAE from the reward on the row's last model token instead; with
terminal rewards and gamma = 1 that is the episode's return for every sample).
Rows come in multiples of the run's batch size, so the train step compiles
once per length bucket, not once per batch. The tokens of model calls sampled
before the group's ``fresh_from`` version are masked out of the loss (see
`rl_core.pipeline.queue`); their episode's reward still counts in its group.

A group split around its stragglers (async runs) sends its finished members
first. Those are the quick episodes, and in many games the quick ones are the
good ones: against their own mean they would get next to no credit (in a run of
the demo game over half the groups split, and async learned less per step than
sync). So with episode credit and the group baseline a first part's missing
members count in its mean at `StragglerRewards`' estimate, the mean reward of
recent stragglers (the members that came in a ``rest`` part), once it has seen
some. The baseline still does not depend on the member's own actions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np

from rl_core.agent.ledger import Sample, Trajectory
from rl_core.algorithms.grpo import Baseline, group_advantages, turn_advantages
from rl_core.models.buckets import next_bucket
from rl_core.pipeline.queue import Group, fresh_mask
from rl_core.training.trainer import TrainBatch

Credit = Literal["episode", "turn"]


def build_batch(
    groups: Sequence[Group],
    *,
    group_size: int,
    rows: int,
    pad_id: int,
    scale_rewards: bool,
    min_length: int = 32,
    max_length: int | None = None,
    bucket: Callable[[int, int], int] = next_bucket,
    credit: Credit = "episode",
    baseline: Baseline = "group",
    gamma: float = 1.0,
    straggler_reward: float | None = None,
) -> TrainBatch:
    """``straggler_reward``: what a first part's missing members count as in its
    mean (episode credit, group baseline); None: the first part's own mean. ``bucket``:
    the rows' padded length from the longest's (`TrainBatch.pack`)."""
    ordered = sorted(groups, key=lambda g: g.task)  # completion order must not change the math
    advantage: Callable[[int, Trajectory, Sample], float | list[float]]
    if credit == "turn":
        per_turn = turn_credit(ordered, group_size, scale_rewards, baseline, gamma)

        def advantage(i: int, t: Trajectory, sample: Sample) -> list[float]:
            turns = np.asarray(sample.turns, dtype=np.int64)
            adv: list[float] = np.where(turns >= 0, per_turn[i, t.member][turns], 0.0).tolist()
            return adv

    else:
        per_episode = episode_credit(ordered, group_size, scale_rewards, baseline, straggler_reward)

        def advantage(i: int, t: Trajectory, sample: Sample) -> float:
            return float(per_episode[i, t.member])

    tokens: list[list[int]] = []
    masks: list[list[int]] = []
    logprobs: list[list[float]] = []
    advs: list[float | list[float]] = []
    row_rewards: list[float] = []
    row_groups: list[int] = []  # members of one group share its prompt (share_prefix)
    lags: list[list[int]] | None = (
        [] if all(g.trainer_version is not None for g in ordered) else None
    )
    for i, group in enumerate(ordered):
        for t in sorted(group.to_train, key=lambda t: t.member):
            for sample in t.samples:
                tokens.append(sample.tokens)
                masks.append(fresh_mask(sample, t.turn_versions, group.fresh_from))
                logprobs.append(sample.logprobs)
                advs.append(advantage(i, t, sample))
                row_rewards.append(t.reward)
                row_groups.append(i)
                if lags is not None:
                    assert group.trainer_version is not None
                    lags.append(policy_lag(sample, t.turn_versions, group.trainer_version))
    n_rows = rows * max(1, -(-len(tokens) // rows))
    return TrainBatch.pack(
        tokens,
        masks,
        logprobs,
        advs,
        rows=n_rows,
        pad_id=pad_id,
        min_length=min_length,
        max_length=max_length,
        bucket=bucket,
        rewards=row_rewards,
        lags=lags,
        groups=row_groups,
    )


def policy_lag(sample: Sample, turn_versions: Sequence[int], trainer_version: int) -> list[int]:
    """Per token, the policy versions between the weights that sampled it and the
    trainer's (0: the same weights; 0 too on tokens no model call made)."""
    return [
        trainer_version - turn_versions[turn] if 0 <= turn < len(turn_versions) else 0
        for turn in sample.turns
    ]


def episode_credit(
    groups: Sequence[Group],
    group_size: int,
    scale_rewards: bool,
    baseline: Baseline = "group",
    straggler_reward: float | None = None,
) -> np.ndarray:
    """Episode-level advantages, [groups, group_size] (`group_advantages`); a first
    part's missing members stand in at ``straggler_reward`` when it is given."""
    rewards = np.zeros((len(groups), group_size), np.float32)
    valid = np.zeros((len(groups), group_size), bool)
    for i, group in enumerate(groups):
        if group.part == "first" and straggler_reward is not None and baseline == "group":
            rewards[i], valid[i] = straggler_reward, True
        for t in group.trajectories:
            rewards[i, t.member], valid[i, t.member] = t.reward, t.kept
    adv = group_advantages(
        jnp.asarray(rewards), jnp.asarray(valid), scale_rewards, baseline=baseline
    )
    return np.asarray(adv)


def turn_credit(
    groups: Sequence[Group],
    group_size: int,
    scale_rewards: bool,
    baseline: Baseline = "group",
    gamma: float = 1.0,
) -> np.ndarray:
    """Turn-level advantages, [groups, group_size, turns] (`turn_advantages`).

    A turn whose model call ended the episode before the environment answered
    (a truncated turn) earned 0.
    """
    turns = max((t.turns for g in groups for t in g.trajectories), default=1)
    rewards = np.zeros((len(groups), group_size, max(turns, 1)), np.float32)
    reached = np.zeros(rewards.shape, bool)
    for i, group in enumerate(groups):
        for t in group.trajectories:
            rewards[i, t.member, : len(t.turn_rewards)] = t.turn_rewards
            reached[i, t.member, : t.turns] = t.kept
    adv = turn_advantages(
        jnp.asarray(rewards), jnp.asarray(reached), scale_rewards, baseline=baseline, gamma=gamma
    )
    return np.asarray(adv)


class StragglerRewards:
    """The mean reward of the last ``window`` stragglers: members of split groups that
    reached the trainer in the ``rest`` part. None until it has seen one."""

    def __init__(self, window: int = 128) -> None:
        self._recent: deque[float] = deque(maxlen=window)

    def observe(self, groups: Iterable[Group]) -> None:
        for group in groups:
            if group.part == "rest":
                self._recent.extend(t.reward for t in group.to_train)

    @property
    def value(self) -> float | None:
        return sum(self._recent) / len(self._recent) if self._recent else None


__all__ = ["StragglerRewards", "build_batch", "episode_credit", "fresh_mask", "turn_credit"]
