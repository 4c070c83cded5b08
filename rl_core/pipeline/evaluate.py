"""Evaluation: a fixed set of held-out episodes played with the current policy.

Every ``train.eval_interval`` steps (and once before the first step) the
pipeline plays ``train.eval_episodes`` episodes whose environment seeds come
from their own stream (``derive_seed(seed, "eval", i)``), disjoint from the
training tasks' and the same at every evaluation, so successive figures
compare one policy with the next on the same problems. Sampling is the
spec's ``train.eval_temperature`` (0: greedy, the usual pass@1).

The episodes share the run's engine and environment and are bounded by the
same concurrency; in ``async`` mode the collector keeps playing training
episodes meanwhile. Nothing here is trained on.

Metrics (``eval/``): ``reward_mean``, ``solved`` (the share of episodes whose
environment reported ``solved``; absent when it never does), ``used_tool``
(likewise, for environments that report whether a tool gave the answer),
``turns_mean``,
``episodes`` (kept) and ``failed`` (timeouts and environment errors, removed
from the means as in training).
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
    ) -> None:
        self.agent = agent
        self.env = env
        self.env_config = dict(env_config)
        self.episodes = episodes
        self.seed = seed
        self.episode_timeout_s = episode_timeout_s
        self.episode_prefix = episode_prefix
        self._limit = asyncio.Semaphore(concurrency)

    async def run(self, step: int) -> dict[str, float]:
        """Play the evaluation set with the engine's current policy; its ``eval/`` metrics."""
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._episode(step, i)) for i in range(self.episodes)]
        return summarize([t.result() for t in tasks])

    async def _episode(self, step: int, i: int) -> Trajectory:
        async with self._limit:
            return await self.agent.run_episode(
                self.env,
                episode_id=eval_episode_id(self.episode_prefix, step, i),
                env_seed=derive_seed(self.seed, "eval", i),
                sample_seed=derive_seed(self.seed, "eval-sample", i),
                env_config=self.env_config,
                timeout_s=self.episode_timeout_s,
            )


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
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
    return metrics


__all__ = ["Evaluator", "summarize"]
