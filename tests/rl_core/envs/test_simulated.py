from __future__ import annotations

import asyncio
import math
import statistics
import time

import pytest

from rl_core.envs import Action
from rl_core.envs.simulated import PRESETS, SimConfig, SimulatedLatency, plan_episode
from rl_core.errors import EnvironmentFailure


def test_plans_are_seeded_and_follow_the_presets() -> None:
    cfg = SimConfig(preset="search")
    assert plan_episode(cfg, 5) == plan_episode(cfg, 5) != plan_episode(cfg, 6)
    plans = [plan_episode(cfg, seed) for seed in range(400)]
    steps = [s for p in plans for s in p.latencies_s]
    # Median of the scaled lognormal is m * scale; 1.5 s / 30 = 50 ms.
    assert statistics.median(steps) == pytest.approx(0.05, rel=0.15)
    assert statistics.median(p.turns for p in plans) == pytest.approx(12, abs=1.5)
    assert max(p.turns for p in plans) <= PRESETS["search"].turns_cap
    assert not any(t for p in plans for t in p.timeouts)


def test_long_tail_is_tunix_s_agentic_workload() -> None:
    plans = [plan_episode(SimConfig(preset="long-tail"), seed) for seed in range(2000)]
    steps = [s for p in plans for s in p.latencies_s]
    assert statistics.median(steps) == pytest.approx(0.05, rel=0.1)
    log_sd = statistics.stdev(math.log(s) for s in steps)
    assert log_sd == pytest.approx(1.0, rel=0.1)
    turns = [p.turns for p in plans]
    assert statistics.median(turns) == pytest.approx(12, abs=1)
    assert max(turns) == 32  # the cap binds: log-sd 1.0 puts ~10 % of episodes past it
    narrow = [plan_episode(SimConfig(preset="long-tail", turns_sigma=0.1), s) for s in range(200)]
    assert max(p.turns for p in narrow) < 20


def test_swe_mixes_slow_test_steps_and_adversarial_tail_times_out() -> None:
    swe = [
        s for seed in range(100) for s in plan_episode(SimConfig(preset="swe"), seed).latencies_s
    ]
    slow = sum(s > 0.5 for s in swe) / len(swe)  # 15 s * 1/10 vs 0.3 s * 1/10
    assert slow == pytest.approx(0.15, abs=0.04)
    tail = SimConfig(preset="adversarial-tail", base="tool-light")
    plans = [plan_episode(tail, seed) for seed in range(3000)]
    timeouts = [t for p in plans for t in p.timeouts]
    assert sum(timeouts) / len(timeouts) == pytest.approx(0.01, abs=0.004)
    logs = [math.log(s) for p in plans for s in p.latencies_s]
    assert statistics.stdev(logs) == pytest.approx(1.5, rel=0.1)


def test_an_episode_takes_its_planned_time_and_echo_reward_follows_the_policy() -> None:
    cfg = {"preset": "tool-light", "time_scale": 1.0}
    plan = plan_episode(SimConfig(**cfg), 1)

    async def main(reply: str) -> tuple[float, float, int]:
        env = SimulatedLatency()
        await env.reset("e", 1, cfg)
        start, total, turn, done = time.monotonic(), 0.0, 0, False
        while not done:
            turn += 1
            step = await env.step("e", turn, Action(content=reply))
            total, done = total + step.reward, step.done
        return time.monotonic() - start, total, turn

    took, reward, turns = asyncio.run(main("OK!"))
    assert turns == plan.turns and took >= sum(plan.latencies_s)
    assert reward == pytest.approx(1.0)
    assert asyncio.run(main("no"))[1] == 0.0


def test_simulated_timeout_fails_the_step_after_its_scaled_hang() -> None:
    cfg = {"preset": "tool-light", "timeout_rate": 1.0, "timeout_s": 1.0, "time_scale": 0.05}

    async def main() -> None:
        env = SimulatedLatency()
        await env.reset("e", 0, cfg)
        with pytest.raises(EnvironmentFailure, match="simulated timeout"):
            await env.step("e", 1, Action(content="ok"))

    asyncio.run(main())


def test_fixed_reward_pays_one_at_the_end() -> None:
    async def main() -> list[float]:
        env = SimulatedLatency()
        await env.reset("e", 2, {"reward": "fixed", "time_scale": 0.01})
        rewards, turn, done = [], 0, False
        while not done:
            turn += 1
            step = await env.step("e", turn, Action(content="anything"))
            rewards.append(step.reward)
            done = step.done
        return rewards

    rewards = asyncio.run(main())
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
