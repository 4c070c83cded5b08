"""The trajectory queue between collector and trainer, with admission control and staleness.

Staleness (one definition, everywhere): the trainer's policy version when it
consumes a trajectory minus the version that started the episode. The
trainer's version is the number of steps it has finished, so a trajectory
started by the policy of step ``v`` and trained on in step ``s`` has
staleness ``s - 1 - v``.

Two mechanisms keep it within ``max_staleness`` (M), with batches of B groups:

- *Admission*: a group may start only while the groups started but not yet
  consumed number fewer than ``(v + M + 1) * B - consumed`` (v: the current
  version; consumed: groups taken into batches so far). Every group admitted
  at version v therefore has a slot in the batches of steps up to v + M + 1,
  and the collector can never run more than M steps ahead: with M = 0 it
  waits for each new policy, which is the synchronous algorithm.
- *The gate at consumption*: a straggler can still be overtaken by groups
  admitted after it. One whose staleness exceeds M when the trainer reaches it
  is dropped, or with ``policy: requeue`` played again under the newest
  policy (same task, a new attempt); never trained on.

The queue itself is bounded (back-pressure on a collector that outruns the
trainer), though admission already keeps it within ``(M + 1) * B``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Literal

from rl_core.agent.ledger import Trajectory


@dataclasses.dataclass(frozen=True, order=True)
class GroupTask:
    """One unit of collection work: a GRPO group of episodes on one environment seed."""

    index: int
    attempt: int = 0  # > 0: played again after a requeue (new episode ids, same seeds)


@dataclasses.dataclass
class Group:
    task: GroupTask
    trajectories: list[Trajectory]

    @property
    def kept(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.kept]

    @property
    def version(self) -> int:
        """The oldest policy that started one of its kept episodes: the group's staleness base."""
        kept = self.kept or self.trajectories
        return min(t.policy_version for t in kept)


class Admission:
    """Counts started-but-unconsumed groups and holds the collector back at the bound."""

    def __init__(self, *, batch_groups: int, max_staleness: int, version: int) -> None:
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.version = version
        self.consumed = version * batch_groups  # a (resumed) run starts at a step boundary
        self.outstanding = 0
        self.peak_outstanding = 0
        self._changed = asyncio.Event()

    @property
    def capacity(self) -> int:
        bound = (self.version + self.max_staleness + 1) * self.batch_groups
        return bound - self.consumed - self.outstanding

    async def acquire(self) -> None:
        while self.capacity <= 0:
            self._changed.clear()
            await self._changed.wait()
        self.outstanding += 1
        self.peak_outstanding = max(self.peak_outstanding, self.outstanding)

    def release(self) -> None:
        """A started group will never be consumed (failed, dropped, requeued): free its slot."""
        self.outstanding -= 1
        self._changed.set()

    def consume(self) -> None:
        self.outstanding -= 1
        self.consumed += 1

    def unconsume(self, n: int) -> None:
        """Groups taken into a batch that will not be trained (a stop mid-batch).

        Their tasks go back to the collector's replay list, to be admitted again."""
        self.consumed -= n
        self._changed.set()

    def set_version(self, version: int) -> None:
        self.version = version
        self._changed.set()


@dataclasses.dataclass
class GateCounts:
    dropped_stale: int = 0
    requeued: int = 0


class GroupQueue:
    """Finished groups in completion order; `take` applies the staleness gate."""

    def __init__(
        self,
        *,
        admission: Admission,
        policy: Literal["drop", "requeue"],
        requeue: Callable[[GroupTask], None],
        maxsize: int,
    ) -> None:
        self.admission = admission
        self.policy = policy
        self._requeue = requeue
        self._queue: asyncio.Queue[Group] = asyncio.Queue(maxsize=maxsize)
        self.counts = GateCounts()
        self.staleness: list[int] = []  # of the groups consumed since the last `drain_staleness`

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def put(self, group: Group) -> None:
        await self._queue.put(group)

    def pending(self) -> list[GroupTask]:
        """Tasks of the groups waiting in the queue (unconsumed; a checkpoint replays them)."""
        return [g.task for g in self._queue._queue]  # type: ignore[attr-defined]

    async def take(self) -> Group:
        """The next group fresh enough for the trainer's current version."""
        admission = self.admission
        while True:
            group = await self._queue.get()
            staleness = admission.version - group.version
            if staleness <= admission.max_staleness:
                admission.consume()
                self.staleness.append(staleness)
                return group
            admission.release()
            if self.policy == "requeue":
                self.counts.requeued += 1
                self._requeue(dataclasses.replace(group.task, attempt=group.task.attempt + 1))
            else:
                self.counts.dropped_stale += 1

    def drain_staleness(self) -> list[int]:
        values, self.staleness = self.staleness, []
        return values


__all__ = ["Admission", "GateCounts", "Group", "GroupQueue", "GroupTask"]
