"""An observation far over ``agent.max_context`` (200 KB) ends the episode truncated, and
says so: in the episode's info, as a per-step metric and in one log line per run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from rl_core.agent.agent import Agent, AgentConfig
from rl_core.envs import Action, Reset, Step
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from tests.rl_core.pipeline.conftest import run_pipeline

HUGE = "x" * 200_000


class Flood:
    """Answers the first step (or, with ``at_reset``, the reset) with 200 KB of text."""

    def __init__(self, *, at_reset: bool = False) -> None:
        self.at_reset = at_reset
        self.closed: list[str] = []

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        return Reset(messages=[{"role": "user", "content": HUGE if self.at_reset else "go"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return Step(messages=[{"role": "user", "content": HUGE}], reward=0.5, done=False)

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)


def agent(tok: BuiltinTokenizer) -> Agent:
    engine = ScriptedEngine(
        [[*tok.encode("1"), tok.end_of_turn_id]], stop_ids=(tok.eos_id, tok.end_of_turn_id)
    )
    config = AgentConfig(max_turns=4, max_new_tokens=4, max_context=512)
    return Agent(engine=engine, tokenizer=tok, config=config, sampling=SamplingParams())


async def episodes(agent: Agent, env: Flood, n: int) -> list[Any]:
    return [
        await agent.run_episode(env, episode_id=f"ep{i}", env_seed=i, sample_seed=i, env_config={})
        for i in range(n)
    ]


def test_a_step_observation_past_max_context_is_in_the_info_and_logged_once(
    tokenizer: BuiltinTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    env = Flood()
    with caplog.at_level(logging.WARNING, logger="rl_core.agent.agent"):
        first, second = asyncio.run(episodes(agent(tokenizer), env, 2))
    for traj in (first, second):
        assert (traj.end_state, traj.end_reason, traj.turns) == ("truncated", "max_context", 1)
        cut = traj.info["observation_truncated"]
        assert cut["turn"] == 1 and cut["chars"] == 200_000 and cut["max_context"] == 512
        assert cut["tokens"] > 512 and 0 < cut["context_tokens"] < 512
        assert len(traj.tokens) < 512  # the observation never reached the ledger
    assert env.closed == ["ep0", "ep1"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per run (per agent), not per episode
    assert "200000 characters" in warnings[0] and "agent.max_context=512" in warnings[0]
    assert "env/observation_truncated" in warnings[0]


def test_a_reset_past_max_context_is_said_too(tokenizer: BuiltinTokenizer) -> None:
    (traj,) = asyncio.run(episodes(agent(tokenizer), Flood(at_reset=True), 1))
    assert (traj.end_state, traj.turns) == ("truncated", 0)
    assert traj.info["observation_truncated"]["context_tokens"] == 0
    assert traj.info["observation_truncated"]["chars"] == 200_000


def test_each_step_counts_its_truncated_episodes() -> None:
    run = run_pipeline(steps=2, batch_groups=2, group_size=2, env=Flood())  # type: ignore[arg-type]
    counts = run.metrics("env/observation_truncated")
    # Every episode that ended in a step, and only those (async: a step may see none).
    assert counts == run.metrics("episode/truncated") and sum(counts) >= 8, counts
    # A run of ordinary observations counts none.
    assert run_pipeline(steps=1, batch_groups=1, group_size=2).metrics(
        "env/observation_truncated"
    ) == [0.0]
