"""The trajectory queue between collector and trainer, with admission control and staleness.

Staleness (one definition, everywhere): the trainer's policy version when it
trains on a token minus the version that sampled it. The trainer's version is
the number of steps it has finished, so a token sampled by the policy of step
``v`` and trained on in step ``s`` has staleness ``s - 1 - v``. Every token
carries its version: an episode in flight across a weight update goes on under
the new policy (a partial rollout, as in AReaL), and each of its model calls is
tagged with the version that sampled it (`Trajectory.turn_versions`).

``max_staleness`` (M) means: **no token older than M versions is trained on.**
Two mechanisms keep it, with batches of B groups of N episodes:

- *Admission* decides when a group may start. The group rule: groups started
  but not consumed stay under ``(v + M + 1) * B - consumed`` (v: the current
  version), so every group admitted at v has a slot in the batches of steps up
  to v + M + 1; synchronous runs (sync mode, M = 0) use it alone: B groups per
  policy, then wait for the next. Asynchronous runs admit by *episode*: a group
  starts while fewer than C episodes (``rollout.concurrency``) are unfinished
  and the same bound counted in episodes has room for N more, counting the
  unfinished episodes and those of finished groups waiting in the queue. An
  episode that ends frees its place at once: the finished members of a group
  whose straggler still runs hold none, so the straggler holds one place, not
  its group's N. (Those members wait for their group; the gate below is what
  keeps their calls within the bound when they are trained.)
- *The gate at consumption* (`GroupQueue.take`) drops no finished work for
  being slow: the model calls of an episode sampled more than M versions ago are
  left out of the loss (their tokens masked; `Group.fresh_from`), and the rest of
  the episode is trained on, with its whole reward in the group's advantages.
  Only an episode with no fresh call at all is left out of the loss (its reward
  still in its group's baseline), and only a group with no such call anywhere is
  dropped, or with ``policy: requeue`` played again under the newest policy
  (same task, a new attempt). Both are counted by reason. A group that passes
  may still be dropped by the queue's ``screen``: with dynamic sampling, one
  whose rewards are all equal (`rl_core.pipeline.dynamic`).

Why masking rather than dropping or waiting: dropping a straggler's group threw
away its finished members and biased training toward short episodes (the
longest are the ones overtaken); waiting for it leaves the trainer idle on a
long tail; and training the stale calls with importance weights alone (the
loss's truncated pi_old / mu) leaves the variance unbounded as the gap grows.
Masking keeps every finished episode's reward in its group and every recent
call's gradient, and bounds how off-policy a trained token can be.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from rl_core.agent.ledger import Sample, Trajectory


@dataclasses.dataclass(frozen=True, order=True)
class GroupTask:
    """One unit of collection work: a GRPO group of episodes on one environment seed."""

    index: int
    attempt: int = 0  # > 0: played again after a requeue (new episode ids, same seeds)


GroupPart = Literal["whole", "first", "rest"]


@dataclasses.dataclass
class Group:
    """A GRPO group, or one of the two parts of a group split around its stragglers.

    ``trajectories`` are the members whose rewards make the group's baseline;
    ``train`` the members the trainer gets rows for (None: all). A ``first`` part
    holds the members that had finished when their calls were about to pass the
    bound; the ``rest`` part holds every member, and trains the others against the
    mean of the whole group.
    """

    task: GroupTask
    trajectories: list[Trajectory]
    part: GroupPart = "whole"
    train: frozenset[int] | None = None
    # Set by the gate when the trainer takes the group: model calls sampled by an older
    # policy than this are masked out of the loss.
    fresh_from: int = 0
    # ... and the policy version the trainer holds then: a token's policy lag is this
    # minus the version that sampled it (None: not taken through the gate).
    trainer_version: int | None = None

    @property
    def members(self) -> int:
        """Episodes of the group this entry stands for in admission's count."""
        return len(self.train) if self.train is not None else len(self.trajectories)

    @property
    def kept(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.kept]

    @property
    def to_train(self) -> list[Trajectory]:
        """Kept members the trainer gets rows for."""
        return [t for t in self.kept if self.train is None or t.member in self.train]

    @property
    def version(self) -> int:
        """The oldest policy that sampled a call of one of its kept episodes."""
        kept = self.kept or self.trajectories
        return min(t.oldest_version for t in kept)

    def trainable(self, fresh_from: int) -> list[Trajectory]:
        """Members to train with at least one model call sampled at ``fresh_from`` or later."""
        return [t for t in self.to_train if t.newest_version >= fresh_from]


def fresh_mask(sample: Sample, turn_versions: Sequence[int], fresh_from: int) -> list[int]:
    """The sample's loss mask without the tokens of calls sampled before ``fresh_from``."""
    if not turn_versions or min(turn_versions) >= fresh_from:
        return sample.loss_mask
    return [
        m if turn < 0 or turn >= len(turn_versions) or turn_versions[turn] >= fresh_from else 0
        for m, turn in zip(sample.loss_mask, sample.turns, strict=True)
    ]


class Admission:
    """When the collector may start a group; see the module docstring.

    ``episodes=None``: the group rule (sync): groups started but not consumed stay
    under ``(v + M + 1) * B - consumed``. ``episodes=C``: the episode rule (async),
    the same bound counted in episodes (a group part consumed frees its members).
    """

    def __init__(
        self,
        *,
        batch_groups: int,
        max_staleness: int,
        version: int,
        episodes: int | None = None,
        group_size: int = 1,
    ) -> None:
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.version = version
        self.episodes = episodes
        self.group_size = group_size
        # A (resumed) run starts at a step boundary: every earlier batch was consumed.
        self.consumed = version * batch_groups  # groups (and group parts) taken into batches
        self.consumed_episodes = version * batch_groups * group_size
        self.outstanding = 0  # groups started, not yet consumed or released
        self.peak_outstanding = 0
        self.pending = 0  # episodes started, not yet consumed or released
        self.unfinished = 0  # episodes started (running or waiting for a slot), not ended
        self.peak_unfinished = 0
        self.queued = 0  # finished groups (or parts) waiting for the trainer
        self._changed = asyncio.Event()
        self.version_changed = asyncio.Event()

    @property
    def may_start(self) -> bool:
        bound = self.version + self.max_staleness + 1  # in batches
        if self.episodes is None:
            return self.outstanding < bound * self.batch_groups - self.consumed
        room = bound * self.batch_groups * self.group_size - self.consumed_episodes
        return self.unfinished < self.episodes and self.pending + self.group_size <= room

    async def acquire(self) -> None:
        while not self.may_start:
            self._changed.clear()
            await self._changed.wait()
        self.outstanding += 1
        self.peak_outstanding = max(self.peak_outstanding, self.outstanding)
        self.pending += self.group_size
        self.unfinished += self.group_size
        self.peak_unfinished = max(self.peak_unfinished, self.unfinished)

    def episode_ended(self) -> None:
        """One episode of a started group ended (any way): its place is free at once."""
        self.unfinished -= 1
        self._changed.set()

    def enqueued(self) -> None:
        self.queued += 1

    def dequeued(self) -> None:
        self.queued -= 1
        self._changed.set()

    def release(self, group: Group | None = None) -> None:
        """Started work that will never be consumed (failed, dropped, requeued): free it."""
        part = group.part if group else "whole"
        if part != "first":  # a first part's group is still in flight
            self.outstanding -= 1
        self.pending -= group.members if group else self.group_size
        self._changed.set()

    def consume(self, group: Group) -> None:
        if group.part != "first":
            self.outstanding -= 1
        self.consumed += 1
        self.pending -= group.members
        self.consumed_episodes += group.members

    def unconsume(self, groups: list[Group]) -> None:
        """Groups taken into a batch that will not be trained (a stop mid-batch).

        Their tasks go back to the collector's replay list, to be admitted again."""
        self.consumed -= len(groups)
        self.consumed_episodes -= sum(g.members for g in groups)
        self._changed.set()

    def set_version(self, version: int) -> None:
        self.version = version
        self._changed.set()
        # Wakes every group waiting on its stragglers (`Collector`), then starts afresh.
        self.version_changed.set()
        self.version_changed = asyncio.Event()

    def expiring(self, oldest_version: int) -> bool:
        """Whether a call of ``oldest_version`` is fresh in the next step but not after it."""
        return oldest_version <= self.version - self.max_staleness


@dataclasses.dataclass
class GateCounts:
    dropped_stale: int = 0  # groups: too few episodes with a fresh call
    requeued: int = 0
    # Episodes of consumed groups: kept ones with no fresh call (not trained on, reward
    # still in the group's baseline), and model calls masked for being too old.
    episodes_untrained_stale: int = 0
    calls_masked_stale: int = 0
    split: int = 0  # groups whose finished members were trained before their stragglers


class Screen(Protocol):
    """A last say on a group the gate would hand over: `rl_core.pipeline.dynamic`'s."""

    def drops(self, group: Group) -> bool: ...


class GroupQueue:
    """Finished groups in completion order; `take` applies the staleness gate."""

    def __init__(
        self,
        *,
        admission: Admission,
        policy: Literal["drop", "requeue"],
        requeue: Callable[[GroupTask], None],
        maxsize: int,
        screen: Screen | None = None,
    ) -> None:
        self.admission = admission
        self.policy = policy
        self._requeue = requeue
        self.screen = screen
        self._queue: asyncio.Queue[Group] = asyncio.Queue(maxsize=maxsize)
        self.counts = GateCounts()
        # Per trained episode, the age of its oldest trained call, since `drain_staleness`.
        self.staleness: list[int] = []

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def put(self, group: Group) -> None:
        await self._queue.put(group)
        self.admission.enqueued()

    def pending(self) -> list[GroupTask]:
        """Tasks of the groups waiting in the queue (unconsumed; a checkpoint replays them)."""
        return [g.task for g in self._queue._queue]  # type: ignore[attr-defined]

    async def take(self) -> Group:
        """The next group with enough fresh episodes for the trainer's current version."""
        admission = self.admission
        while True:
            group = await self._queue.get()
            admission.dequeued()
            fresh_from = admission.version - admission.max_staleness
            trainable = group.trainable(fresh_from)
            if trainable and self.screen is not None and self.screen.drops(group):
                # Played and finished, but no signal: its place goes to a new group.
                admission.release(group)
                continue
            if trainable:
                group.fresh_from, group.trainer_version = fresh_from, admission.version
                admission.consume(group)
                self._count_masked(group, trainable, fresh_from)
                return group
            admission.release(group)
            if self.policy == "requeue" and group.part == "whole":
                self.counts.requeued += 1
                self._requeue(dataclasses.replace(group.task, attempt=group.task.attempt + 1))
            else:
                self.counts.dropped_stale += 1

    def _count_masked(self, group: Group, trainable: list[Trajectory], fresh_from: int) -> None:
        version = self.admission.version
        self.counts.episodes_untrained_stale += len(group.to_train) - len(trainable)
        self.counts.split += group.part == "first"
        for t in trainable:
            fresh = [v for v in t.turn_versions if v >= fresh_from]
            self.counts.calls_masked_stale += len(t.turn_versions) - len(fresh)
            # The oldest token trained on, per episode: within the bound by construction.
            self.staleness.append(version - min(fresh, default=t.policy_version))

    def drain_staleness(self) -> list[int]:
        values, self.staleness = self.staleness, []
        return values


__all__ = ["Admission", "GateCounts", "Group", "GroupQueue", "GroupTask", "Screen", "fresh_mask"]
