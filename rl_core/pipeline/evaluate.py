"""Evaluation: a fixed set of held-out episodes played with the current policy.

Every ``train.eval_interval`` steps (and once before the first step) the
pipeline plays ``train.eval_episodes`` episodes whose environment seeds come
from their own stream (``derive_seed(seed, "eval", i)``), disjoint from the
training tasks' and the same at every evaluation, so successive figures
compare one policy with the next on the same problems. Sampling is the
spec's ``train.eval_temperature`` (0: greedy, the usual pass@1).

Each of those tasks is played ``train.eval_k`` times (k samples: the same
environment seed, hence the same problem, and each its own sampling seed), so
an evaluation plays ``eval_episodes * eval_k`` episodes. A ``dataset``
environment serves held-out task ``i`` from its eval split's row ``i mod m``
(the episode id names the task), never from a training row.

The episodes share the run's engine and environment and are bounded by the
same concurrency; in ``async`` mode the collector keeps playing training
episodes meanwhile. Nothing here is trained on.

Metrics (``eval/``): ``reward_mean``, ``solved`` (the share of episodes whose
environment reported ``solved``; absent when it never does), ``used_tool``
(likewise, for environments that report whether a tool gave the answer),
``turns_mean``,
``episodes`` (kept) and ``failed`` (timeouts and environment errors, removed
from the means as in training); ``pass@1`` and, when ``eval_k`` is above 1,
``pass@<k>`` (e.g. ``eval/pass@8``): the unbiased estimates of
`rl_core.pipeline.pass_at_k` over the tasks, a sample passing when its reward
is at least ``train.eval_pass_threshold``. There a failed sample counts as one
that did not pass (every task keeps its k samples: the estimator needs n >= k).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from rl_core.agent.agent import Agent
from rl_core.agent.ledger import Trajectory
from rl_core.envs.base import Environment
from rl_core.envs.episodes import eval_episode_id
from rl_core.pipeline.collector import derive_seed
from rl_core.pipeline.judging import judge_trajectories, judges_groups
from rl_core.pipeline.pass_at_k import mean_pass_at_k


class Evaluator:
    def __init__(
        self,
        *,
        agent: Agent,
        env: Environment,
        env_config: Mapping[str, Any],
        episodes: int,
        concurrency: int,
        seed: int,
        episode_timeout_s: float | None,
        episode_prefix: str = "",
        samples: int = 1,
        pass_threshold: float = 1.0,
    ) -> None:
        self.agent = agent
        self.env = env
        self.env_config = dict(env_config)
        self.episodes = episodes
        self.seed = seed
        self.episode_timeout_s = episode_timeout_s
        self.episode_prefix = episode_prefix
        self.samples = samples
        self.pass_threshold = pass_threshold
        self._limit = asyncio.Semaphore(concurrency)

    async def run(self, step: int) -> dict[str, float]:
        """Play the evaluation set with the engine's current policy; its ``eval/`` metrics."""
        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(self._episode(step, i, j))
                for i in range(self.episodes)
                for j in range(self.samples)
            ]
        played = [t.result() for t in tasks]
        if judges_groups(self.env):  # a task's samples are a group: one judge call each
            async with asyncio.TaskGroup() as tg:
                for i in range(0, len(played), self.samples):
                    tg.create_task(judge_trajectories(self.env, played[i : i + self.samples]))
        return summarize(played, k=self.samples, pass_threshold=self.pass_threshold)

    async def _episode(self, step: int, i: int, j: int) -> Trajectory:
        # Sample 0 keeps the sampling seed a one-sample evaluation always had.
        sample_seed = (
            derive_seed(self.seed, "eval-sample", i)
            if j == 0
            else derive_seed(self.seed, "eval-sample", i, j)
        )
        async with self._limit:
            return await self.agent.run_episode(
                self.env,
                episode_id=eval_episode_id(self.episode_prefix, step, i, j),
                env_seed=derive_seed(self.seed, "eval", i),
                sample_seed=sample_seed,
                env_config=self.env_config,
                timeout_s=self.episode_timeout_s,
            )


def summarize(
    trajectories: list[Trajectory], *, k: int = 1, pass_threshold: float = 1.0
) -> dict[str, float]:
    """The ``eval/`` metrics of an evaluation's episodes, ``k`` consecutive ones per task."""
    kept = [t for t in trajectories if t.kept]
    n = max(len(kept), 1)
    metrics = {
        "eval/reward_mean": sum(t.reward for t in kept) / n,
        "eval/turns_mean": sum(t.turns for t in kept) / n,
        "eval/episodes": float(len(kept)),
        "eval/failed": float(len(trajectories) - len(kept)),
    }
    for flag in ("solved", "used_tool"):
        if any(flag in t.info for t in kept):
            metrics[f"eval/{flag}"] = sum(bool(t.info.get(flag)) for t in kept) / n
    passed = [t.kept and t.reward >= pass_threshold for t in trajectories]
    tasks = [passed[i : i + k] for i in range(0, len(passed), k)]
    metrics["eval/pass@1"] = mean_pass_at_k(tasks, 1)
    if k > 1:
        metrics[f"eval/pass@{k}"] = mean_pass_at_k(tasks, k)
    return metrics


__all__ = ["Evaluator", "summarize"]
