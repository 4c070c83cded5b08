"""``sim_latency``: an environment that only takes time, with the presets of docs/benchmarks.md.

For benchmarks of the collector and pipeline: each episode's number of turns
and each step's latency are drawn from lognormals (median m, log-sd sigma),
seeded by the reset seed, so candidate and baseline see the same workload.
`plan_episode` gives the plan without running it, for the benchmark's model
inputs (E[W], tail CV).

- ``tool-light``: step m = 20 ms, sigma 0.5; turns m = 3, cap 10.
- ``search``: step m = 1.5 s, sigma 1.0; turns m = 12, cap 128; time scale 1/30.
- ``swe``: 85 % steps m = 0.3 s sigma 0.6, 15 % m = 15 s sigma 0.7; turns m = 40,
  cap 100; time scale 1/10.
- ``long-tail``: step m = 50 ms, sigma 1.0; turns m = 12, sigma 1.0, cap 32 (the
  workload of Tunix's agentic benchmark, which issue #20's figures use).
- ``adversarial-tail``: the ``base`` preset (``search`` unless given) with
  sigma 1.5 on every step and 1 % of steps timing out: such a step hangs for
  ``timeout_s`` (scaled), then fails as an `EnvironmentFailure`, as a
  webhook call that times out would.

Turn counts use a log-sd of ``turns_sigma`` (unset: the preset's, 0.5 unless it
says). Latencies are multiplied by ``time_scale``.

Reward: ``reward: "echo"`` (default) pays 1/turns for each reply that
contains ``keyword`` ("ok", which every prompt asks for), so a policy can
move it a little and a trainer has a signal; ``reward: "fixed"`` pays 1 at
the end whatever the policy does (zero advantages: pure plumbing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.config import parse_config
from rl_core.errors import EnvironmentFailure


@dataclasses.dataclass(frozen=True)
class Latency:
    weight: float
    median_s: float
    sigma: float


@dataclasses.dataclass(frozen=True)
class Preset:
    steps: tuple[Latency, ...]
    turns_median: float
    turns_cap: int
    time_scale: float = 1.0
    timeout_rate: float = 0.0
    turns_sigma: float = 0.5


PRESETS: dict[str, Preset] = {
    "tool-light": Preset((Latency(1.0, 0.020, 0.5),), 3, 10),
    "search": Preset((Latency(1.0, 1.5, 1.0),), 12, 128, time_scale=1 / 30),
    "swe": Preset((Latency(0.85, 0.3, 0.6), Latency(0.15, 15.0, 0.7)), 40, 100, time_scale=1 / 10),
    "long-tail": Preset((Latency(1.0, 0.050, 1.0),), 12, 32, turns_sigma=1.0),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    preset: str = "tool-light"
    base: str = "search"  # what adversarial-tail makes heavy-tailed
    time_scale: float | None = None  # None: the preset's
    turns_sigma: float | None = None  # None: the preset's
    timeout_rate: float | None = None  # None: the preset's
    timeout_s: float = 30.0  # before time_scale
    reward: str = "echo"
    keyword: str = "ok"

    def __post_init__(self) -> None:
        if self.preset not in (*PRESETS, "adversarial-tail"):
            raise ValueError(f"preset must be one of {[*PRESETS, 'adversarial-tail']}")
        if self.base not in PRESETS:
            raise ValueError(f"base must be one of {list(PRESETS)}")
        if self.reward not in ("echo", "fixed"):
            raise ValueError("reward must be 'echo' or 'fixed'")
        if self.time_scale is not None and self.time_scale <= 0:
            raise ValueError("time_scale must be positive")

    def resolved(self) -> Preset:
        if self.preset == "adversarial-tail":
            base = PRESETS[self.base]
            steps = tuple(dataclasses.replace(s, sigma=1.5) for s in base.steps)
            preset = dataclasses.replace(base, steps=steps, timeout_rate=0.01)
        else:
            preset = PRESETS[self.preset]
        if self.time_scale is not None:
            preset = dataclasses.replace(preset, time_scale=self.time_scale)
        if self.timeout_rate is not None:
            preset = dataclasses.replace(preset, timeout_rate=self.timeout_rate)
        if self.turns_sigma is not None:
            preset = dataclasses.replace(preset, turns_sigma=self.turns_sigma)
        return preset


@dataclasses.dataclass(frozen=True)
class EpisodePlan:
    latencies_s: tuple[float, ...]  # scaled, one per turn
    timeouts: tuple[bool, ...]

    @property
    def turns(self) -> int:
        return len(self.latencies_s)


def plan_episode(cfg: SimConfig, seed: int) -> EpisodePlan:
    """The turns and step latencies of episode ``seed``, deterministically."""
    preset, rng = cfg.resolved(), random.Random(seed)
    turns = rng.lognormvariate(math.log(preset.turns_median), preset.turns_sigma)
    n = min(preset.turns_cap, max(1, round(turns)))
    weights = [s.weight for s in preset.steps]
    latencies, timeouts = [], []
    for _ in range(n):
        mix = rng.choices(preset.steps, weights)[0]
        latencies.append(rng.lognormvariate(math.log(mix.median_s), mix.sigma) * preset.time_scale)
        timeouts.append(rng.random() < preset.timeout_rate)
    return EpisodePlan(tuple(latencies), tuple(timeouts))


@dataclasses.dataclass
class _Episode:
    config: SimConfig
    plan: EpisodePlan
    turns: int = 0
    results: dict[int, Step] = dataclasses.field(default_factory=dict)


class SimulatedLatency:
    name = "sim_latency"

    def __init__(self) -> None:
        self._episodes: dict[str, _Episode] = {}

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = parse_config(SimConfig, config, self.name)
        plan = plan_episode(cfg, seed)
        self._episodes[episode_id] = _Episode(config=cfg, plan=plan)
        prompt = f"Reply with the word '{cfg.keyword}'."
        return Reset(
            messages=[{"role": "user", "content": prompt}], info={"planned_turns": plan.turns}
        )

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"sim_latency: no episode {episode_id!r}; call reset first")
        if step in episode.results:
            return episode.results[step]
        cfg, plan = episode.config, episode.plan
        if episode.turns >= plan.turns:
            raise EnvironmentFailure(f"sim_latency: episode {episode_id!r} is already over")
        index = episode.turns
        episode.turns += 1
        if plan.timeouts[index]:
            await asyncio.sleep(cfg.timeout_s * cfg.resolved().time_scale)
            raise EnvironmentFailure(f"sim_latency: simulated timeout at step {step}")
        await asyncio.sleep(plan.latencies_s[index])
        done = episode.turns >= plan.turns
        if cfg.reward == "fixed":
            reward = 1.0 if done else 0.0
        else:
            reward = float(cfg.keyword.lower() in action.content.lower()) / plan.turns
        message = {"role": "user", "content": f"Reply with the word '{cfg.keyword}'."}
        result = Step(
            [] if done else [message], reward, done, {"latency_s": plan.latencies_s[index]}
        )
        episode.results[step] = result
        return result

    async def close(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)
