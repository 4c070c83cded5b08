"""The collector: many episodes in flight on one event loop, released to the queue by group.

At most ``concurrency`` episodes run at once; `Admission` says when the next
group may start (in async runs, as soon as fewer than ``concurrency`` episodes
are unfinished: an episode that ends frees its place at once).

Work is a sequence of tasks (`GroupTask`), numbered from 0; task ``i`` is a
GRPO group of ``group_size`` episodes sharing the environment seed of ``i``.
Seeds come from (run seed, task index, member), never from a clock or from
the order episodes finish, so a task played twice plays the same game.

The collector's position is ``next_index`` plus the tasks started but not
consumed (in flight, queued, or requeued). A checkpoint stores it; a resumed
run replays those tasks first, so no task is skipped and none is trained twice.

Stragglers: in async runs a group whose finished members would otherwise pass
the staleness bound while a straggler runs is sent in two parts
(`_send_first_part`; `rl_core.pipeline.queue` explains the bound).

Group rule, on failures: episodes that ended ``timeout``, ``env_error`` or
``cancelled`` are removed from their group (and counted by reason), never
scored 0. A group keeps training with the rest if at least two episodes remain
(one if ``group_size`` is 1): GRPO's advantages are then taken over the
survivors. Fewer than that and the whole group is dropped: a lone episode has
no group baseline. Either way the trainer never sees a partial group by
accident: a group reaches the queue only when its last episode has ended.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from rl_core.agent.ledger import Trajectory
from rl_core.envs.episodes import train_episode_id
from rl_core.pipeline.judging import (
    judge_spent,
    judge_trajectories,
    judges_groups,
    restore_judge_spent,
)
from rl_core.pipeline.queue import Admission, Group, GroupQueue, GroupTask

log = logging.getLogger(__name__)


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (same parts, same seed, on every machine)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


class EpisodePlayer(Protocol):
    """What plays one episode: the built-in `rl_core.agent.agent.Agent` against ``env``, or
    `rl_core.sessions.broker.SessionBroker`, which hands the episode to a client."""

    async def run_episode(
        self,
        env: Any,
        *,
        episode_id: str,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
        timeout_s: float | None = None,
        into: Trajectory | None = None,
    ) -> Trajectory: ...


class Collector:
    def __init__(
        self,
        *,
        agent: EpisodePlayer,
        env: Any,  # an `rl_core.envs.base.Environment`; None when clients play (sessions)
        admission: Admission,
        queue: GroupQueue,
        group_size: int,
        concurrency: int,
        seed: int,
        env_config: Mapping[str, Any],
        episode_timeout_s: float | None,
        episode_prefix: str = "",
        position: Mapping[str, Any] | None = None,
    ) -> None:
        self.agent = agent
        self.env = env
        self.admission = admission
        self.queue = queue
        self.group_size = group_size
        self.seed = seed
        self.env_config = dict(env_config)
        self.episode_timeout_s = episode_timeout_s
        self.episode_prefix = episode_prefix
        self._limit = asyncio.Semaphore(concurrency)
        position = position or {}
        self.next_index: int = int(position.get("next_index", 0))
        # Replayed before any new task: unconsumed work of an earlier attempt, and requeues.
        self._replay: collections.deque[GroupTask] = collections.deque(
            GroupTask(int(i), int(a)) for i, a in position.get("pending", [])
        )
        self._wake = asyncio.Event()
        self.inflight: dict[str, Trajectory] = {}
        self._started: dict[GroupTask, None] = {}  # tasks in flight (ordered set)
        self.finished: list[Trajectory] = []  # every ended episode, drained each step
        self.cancelled: list[Trajectory] = []
        self.dropped_groups = 0  # too few survivors
        self.first_error: str | None = None
        restore_judge_spent(env, position.get("judge"))  # the run's budget, not the attempt's

    def min_survivors(self) -> int:
        return min(2, self.group_size)

    def position(self) -> dict[str, Any]:
        """What a checkpoint needs to resume exactly: see the module docstring."""
        pending = sorted({*self._started, *self.queue.pending(), *self._replay})
        out = {"next_index": self.next_index, "pending": [[t.index, t.attempt] for t in pending]}
        spent = judge_spent(self.env)
        return out if spent is None else {**out, "judge": spent}

    def requeue(self, task: GroupTask) -> None:
        self._replay.append(task)

    def unconsume(self, tasks: list[GroupTask]) -> None:
        """Tasks taken into a batch that was abandoned: they are replayed on resume."""
        self._replay.extendleft(reversed(tasks))

    def drain_finished(self) -> list[Trajectory]:
        out, self.finished = self.finished, []
        return out

    async def run(self) -> None:
        """Start groups as admission allows, until cancelled (in-flight ones end ``cancelled``)."""
        async with asyncio.TaskGroup() as tg:
            while True:
                await self.admission.acquire()
                task = self._replay.popleft() if self._replay else self._new_task()
                self._started[task] = None
                tg.create_task(self._play_group(task), name=f"group-{task.index}")

    def _new_task(self) -> GroupTask:
        task = GroupTask(self.next_index)
        self.next_index += 1
        return task

    async def _play_group(self, task: GroupTask) -> None:
        async with asyncio.TaskGroup() as tg:
            episodes = [tg.create_task(self._episode(task, k)) for k in range(self.group_size)]
            # Async runs (admission by episode) only: sync ones keep groups whole. A group
            # too small to leave a first part of `min_survivors` and a straggler stays whole,
            # as does one a judge scores (it reads the whole group in one call).
            split = self.admission.episodes is not None and self.group_size > self.min_survivors()
            split = split and not judges_groups(self.env)
            sent = await self._send_first_part(task, episodes) if split else None
        group = Group(task=task, trajectories=[e.result() for e in episodes])
        if judges_groups(self.env):  # its one call, off the other groups' path
            error = await judge_trajectories(self.env, group.trajectories)
            self.first_error = self.first_error or error
            self.finished.extend(group.trajectories)  # counted as the judge left them
        del self._started[task]
        if sent is not None:
            group.part, group.train = "rest", frozenset(range(self.group_size)) - sent
        if len(group.kept) < self.min_survivors() or not group.to_train:
            self.dropped_groups += 1
            self.admission.release(group)
            return
        await self.queue.put(group)

    async def _send_first_part(
        self, task: GroupTask, episodes: list[asyncio.Task[Trajectory]]
    ) -> frozenset[int] | None:
        """While stragglers run: when the finished members' oldest calls are about to pass
        the staleness bound, send them to the trainer as the group's first part (trained
        against their own mean). Returns the members sent, None if the group stayed whole."""
        while not all(e.done() for e in episodes):
            version_changed = self.admission.version_changed
            wake = asyncio.ensure_future(version_changed.wait())
            try:
                await asyncio.wait(
                    [*(e for e in episodes if not e.done()), wake],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                wake.cancel()
            ended = [e for e in episodes if e.done() and not e.cancelled()]
            done = [e.result() for e in ended if e.exception() is None]
            kept = [t for t in done if t.kept]
            if len(kept) < self.min_survivors() or len(done) == len(episodes):
                continue
            if self.admission.expiring(min(t.oldest_version for t in kept)):
                await self.queue.put(Group(task=task, trajectories=kept, part="first"))
                return frozenset(t.member for t in kept)
        return None

    async def _episode(self, task: GroupTask, member: int) -> Trajectory:
        episode_id = train_episode_id(self.episode_prefix, task.index, member, task.attempt)
        traj = Trajectory(episode_id=episode_id, group=task.index, member=member)
        self.inflight[episode_id] = traj
        try:
            async with self._limit:
                await self.agent.run_episode(
                    self.env,
                    episode_id=episode_id,
                    env_seed=derive_seed(self.seed, "env", task.index),
                    sample_seed=derive_seed(self.seed, "sample", task.index, member, task.attempt),
                    env_config=self.env_config,
                    timeout_s=self.episode_timeout_s,
                    into=traj,
                )
        except asyncio.CancelledError:
            if traj.end_state != "cancelled":  # cancelled while waiting for a slot
                traj.end("cancelled", "cancelled")
            self.cancelled.append(traj)
            raise
        finally:
            del self.inflight[episode_id]
            self.admission.episode_ended()
        if traj.error and self.first_error is None:
            self.first_error = f"{traj.end_reason}: {traj.error}"
        if not judges_groups(self.env):  # a judged one once its group is judged
            self.finished.append(traj)
        return traj


__all__ = ["Collector", "EpisodePlayer", "derive_seed"]
