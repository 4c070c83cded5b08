"""The agent's token ledger and end states, against a scripted engine and real environments."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rl_core.agent import Agent, AgentConfig, Trajectory
from rl_core.envs import Action, Reset, Step
from rl_core.envs.guess_number import GuessNumber
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.tokenizer import BuiltinTokenizer

SEED_OF_5 = 5  # guess_number target for seed 5 on 1..8 (checked below)


def run(
    tok: BuiltinTokenizer,
    replies: list[str],
    *,
    env: Any = None,
    config: AgentConfig | None = None,
    stop: bool = True,
    delay_s: float = 0.0,
    timeout_s: float | None = None,
) -> tuple[Trajectory, ScriptedEngine]:
    end = [tok.end_of_turn_id] if stop else []
    engine = ScriptedEngine(
        [tok.encode(r) + end for r in replies],
        stop_ids=(tok.eos_id, tok.end_of_turn_id),
        delay_s=delay_s,
    )
    agent = Agent(
        engine=engine,
        tokenizer=tok,
        config=config or AgentConfig(max_turns=8, max_new_tokens=16, max_context=512),
        sampling=SamplingParams(),
    )
    traj = asyncio.run(
        agent.run_episode(
            env or GuessNumber(),
            episode_id="ep",
            env_seed=SEED_OF_5,
            sample_seed=0,
            env_config={"low": 1, "high": 8, "max_turns": 4},
            timeout_s=timeout_s,
        )
    )
    return traj, engine


def test_seed_of_5(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["1"])
    assert traj.info["target"] == 5


def test_ledger_and_mask_over_a_multi_turn_episode(tokenizer: BuiltinTokenizer) -> None:
    tok = tokenizer
    traj, engine = run(tok, ["3", "junk 7", "5"])
    end, asst = [tok.end_of_turn_id], tok.assistant_prefix()
    user = tok.token_id("<|user|>")
    prompt = tok.render_messages([{"role": "user", "content": "Guess the number between 1 and 8."}])
    model = [tok.encode("3") + end, tok.encode("junk 7") + end, tok.encode("5") + end]
    obs = [[user, *tok.encode("higher"), *end, *asst], [user, *tok.encode("lower"), *end, *asst]]
    expected = prompt + asst + model[0] + obs[0] + model[1] + obs[1] + model[2]
    assert traj.tokens == expected
    mask = [0] * len(prompt + asst) + [1] * len(model[0]) + [0] * len(obs[0])
    mask += [1] * len(model[1]) + [0] * len(obs[1]) + [1] * len(model[2])
    assert traj.loss_mask == mask
    # Each model token carries its call's logprob; everything else is 0.
    want_lp = [0.0 if m == 0 else None for m in mask]
    calls = iter([-0.1] * len(model[0]) + [-0.2] * len(model[1]) + [-0.3] * len(model[2]))
    want_lp = [next(calls) if w is None else w for w in want_lp]
    assert traj.logprobs == pytest.approx(want_lp)
    # The engine saw exactly the ledger so far at every turn: nothing re-tokenised.
    assert engine.prompts[1] == prompt + asst + model[0] + obs[0]
    assert traj.end_state == "done" and traj.turns == 3
    assert traj.reward == pytest.approx(3 * 0.1 / 4 + 1.0 - 2 * 0.2)


def test_turn_without_end_token_truncates(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["1234567"], stop=False, config=AgentConfig(max_new_tokens=4))
    assert traj.end_state == "truncated" and traj.turns == 1
    assert traj.model_tokens == 4 and traj.reward == 0.0


def test_max_turns_truncates(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["1"], config=AgentConfig(max_turns=2))
    assert traj.end_state == "truncated" and traj.turns == 2


def test_max_context_truncates_and_is_never_exceeded(tokenizer: BuiltinTokenizer) -> None:
    config = AgentConfig(max_turns=8, max_new_tokens=8, max_context=24)
    traj, _ = run(tokenizer, ["1"], config=config)
    assert traj.end_state == "truncated"
    assert len(traj.tokens) <= 24 and traj.turns < 4


def test_environment_done_by_its_own_turn_limit(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["1"])  # never right; guess_number stops after its 4 turns
    assert traj.end_state == "done" and traj.turns == 4


class BrokenEnv:
    def __init__(self) -> None:
        self.closed: list[str] = []

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        return Reset(messages=[{"role": "user", "content": "go"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        raise ConnectionError("webhook down")

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)


def test_environment_failure_is_an_end_state(tokenizer: BuiltinTokenizer) -> None:
    env = BrokenEnv()
    traj, _ = run(tokenizer, ["1"], env=env)
    assert traj.end_state == "env_error"
    assert traj.error == "webhook down"
    assert env.closed == ["ep"]


def test_slow_episode_times_out(tokenizer: BuiltinTokenizer) -> None:
    env = BrokenEnv()
    traj, _ = run(tokenizer, ["1"], env=env, delay_s=0.5, timeout_s=0.05)
    assert traj.end_state == "timeout"
    assert env.closed == ["ep"]


def test_system_prompt_is_rendered_first(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["5"], config=AgentConfig(system_prompt="Be brief"))
    sys_ids = tokenizer.render_messages([{"role": "system", "content": "Be brief"}])
    assert traj.tokens[: len(sys_ids)] == sys_ids
    assert traj.end_state == "done"
