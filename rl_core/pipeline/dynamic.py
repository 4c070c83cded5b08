"""Dynamic sampling (DAPO, Yu et al. 2025, section 3.2): groups that teach nothing are
dropped at the queue, and the collector plays more to fill the batch.

A GRPO group whose members all earned the same reward has every advantage
zero under the group baseline (``A = R - mean R``), so its tokens add nothing
to the policy gradient while still counting in the loss's token or sequence
normaliser: a batch of mostly such groups (early RLVR on hard problems, all 0;
late, on easy ones, all 1) is a small batch diluted. With
``algorithm.dynamic_sampling.enabled`` the queue's `take` drops such a group
instead of handing it to the trainer: admission releases its place (as for a
stale group, `rl_core.pipeline.queue`), so the collector starts another, and
the step waits for B groups that carry a signal.

Bounded: at most ``max_dropped`` groups per step are dropped. Past the cap the
step takes the groups as they come, equal ones included, and trains. Why train
rather than skip the step or train a smaller batch: a skipped step does not
advance the policy version that admission and the staleness bound count in (the
run would stall or lose its step count), and a smaller batch changes the train
step's shapes (a compile per size) and its normaliser; an equal group in the
batch costs its rows and moves the policy only through the KL and entropy
terms, which is what the run without the option does with every such group.
The step says so: ``groups/trained_equal`` counts them, and the pipeline logs
that the cap was reached.

What is judged: a whole group, or the ``rest`` part of a group split around its
stragglers (whose advantages are taken over the whole group). A ``first`` part
is never dropped: its baseline may hold the stragglers' estimate
(`rl_core.pipeline.batch.StragglerRewards`) and the rest of its group is still
being played. Only kept members count (failed ones are not in the baseline).

A dropped group's episodes were played: they count in ``episode/<end state>``,
their tasks are not replayed on resume (like a group the staleness gate drops,
its rows are used, not skipped by accident), and they are reported as untrained
trajectories, with ``info["dropped"] = "equal_rewards"``.
"""

from __future__ import annotations

import numpy as np

from rl_core.pipeline.queue import Group

DROPPED_EQUAL = "equal_rewards"  # a dropped episode's info["dropped"]


def carries_signal(group: Group, *, turn_credit: bool = False) -> bool:
    """Whether some member's GRPO advantage (group baseline) may be non-zero.

    Episode credit: the kept members' rewards differ (compared as float32, the
    advantages' dtype). Turn credit: their per-turn rewards differ, so the
    returns-to-go at some turn do (equal episode rewards reached by different
    turns still teach which turn earned them). A ``first`` part counts as carrying
    one (module docstring). A lone kept member (``group_size`` 1, where the spec
    refuses dynamic sampling) has none: it is its own group's mean."""
    if group.part == "first":
        return True
    kept = group.kept
    if len(kept) < 2:
        return False
    if turn_credit:
        first = np.asarray(kept[0].turn_rewards, np.float32)
        return any(
            not np.array_equal(np.asarray(t.turn_rewards, np.float32), first) for t in kept[1:]
        )
    rewards = np.asarray([t.reward for t in kept], np.float32)
    return bool(rewards.min() != rewards.max())


class EqualRewardScreen:
    """Which groups the queue drops this step: equal-reward ones, ``max_dropped`` at most.

    The pipeline calls `begin_step` before each step's first take and `drain` after
    its last; `GroupQueue.take` calls `drops` on each group it would hand over."""

    def __init__(self, *, max_dropped: int, turn_credit: bool = False) -> None:
        self.max_dropped = max_dropped
        self.turn_credit = turn_credit
        self._dropped: list[Group] = []
        self.capped = False  # the step reached the cap; what came after was trained

    def begin_step(self) -> None:
        self._dropped, self.capped = [], False

    def drops(self, group: Group) -> bool:
        if carries_signal(group, turn_credit=self.turn_credit):
            return False
        if len(self._dropped) >= self.max_dropped:
            self.capped = True
            return False
        for t in group.to_train:  # a rest part's first members were trained already
            t.info["dropped"] = DROPPED_EQUAL
        self._dropped.append(group)
        return True

    def drain(self) -> list[Group]:
        """The groups dropped since `begin_step`."""
        out, self._dropped = self._dropped, []
        return out


__all__ = ["DROPPED_EQUAL", "EqualRewardScreen", "carries_signal"]
