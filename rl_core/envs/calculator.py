"""``calculator``: arithmetic word problems with a calculator tool, for instruct models.

Multi-turn: the model may call ``calculator`` (a Hermes/Qwen tool call, see
`rl_core.agent.toolcalls`) any number of times, reads the results as ``tool``
messages, then answers in plain text. The episode ends at the first message
without tool calls; its last number is the answer, and the reward is
``correct_reward`` if it is right, else 0. Problems are drawn from the reset
seed, so a seed always gives the same problem. ``difficulty`` picks the
defaults of the other keys; any key given explicitly wins.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Message, Reset, Step, ToolCall
from rl_core.envs.config import parse_config
from rl_core.envs.safe_math import CalcError, evaluate, format_number
from rl_core.errors import EnvironmentFailure
from rl_core.rewards import last_number

TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "for example '(12 + 7) * 3'"}
            },
            "required": ["expression"],
        },
    },
}

_LEVELS: dict[str, dict[str, Any]] = {
    "easy": {"operands": 2, "max_operand": 99, "operators": "+-"},
    "medium": {"operands": 3, "max_operand": 999, "operators": "+-*"},
    "hard": {"operands": 4, "max_operand": 9999, "operators": "+-*"},
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CalculatorConfig:
    difficulty: str = "medium"
    operands: int | None = None
    max_operand: int | None = None
    operators: str | None = None
    max_turns: int = 4
    correct_reward: float = 1.0
    # Spell out the tool-call format in the prompt: small models' chat templates
    # (SmolLM2's among them) drop the `tools` list, so the model never sees it.
    tool_hint: bool = True

    def __post_init__(self) -> None:
        if self.difficulty not in _LEVELS:
            raise ValueError(f"difficulty must be one of {sorted(_LEVELS)}")
        level = _LEVELS[self.difficulty]
        for key, value in level.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if not 2 <= int(self.operands or 0) <= 8:
            raise ValueError("operands must be between 2 and 8")
        if int(self.max_operand or 0) < 2:
            raise ValueError("max_operand must be at least 2")
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError("operators must be a non-empty subset of '+-*'")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")


def make_problem(seed: int, cfg: CalculatorConfig) -> tuple[str, int]:
    """The expression text of problem ``seed`` and its (integer) value."""
    rng = random.Random(seed)
    assert cfg.operands and cfg.max_operand and cfg.operators  # filled by __post_init__
    parts = [str(rng.randint(2, cfg.max_operand))]
    for _ in range(cfg.operands - 1):
        parts += [rng.choice(cfg.operators), str(rng.randint(2, cfg.max_operand))]
    text = " ".join(parts)
    return text, int(evaluate(text))


def best_reward(config: CalculatorConfig) -> float:
    """The optimum: every problem can be solved (with the tool, or by hand)."""
    return config.correct_reward


# Problems up to this many operand/operator combinations are enumerated exactly.
_ENUMERABLE = 2_000_000


def best_blind_reward(config: CalculatorConfig) -> float:
    """The best expected reward of a policy that reads no observation (the problem
    included): exact where the problems can be enumerated, else a proven upper bound.

    A blind policy's final answer is a fixed number ``a`` (its tool calls return results
    it does not read), so it earns ``correct_reward * P(answer = a)``, best at the most
    likely answer. Bound: given everything but the last operand, the answer is an affine
    function of it with a nonzero integer slope (+-1, or +- the product it ends), so a
    fixed answer matches at most one of its ``max_operand - 1`` equally likely values:
    ``P(answer = a) <= 1 / (max_operand - 1)``.
    """
    assert config.operands and config.max_operand and config.operators  # __post_init__
    values = config.max_operand - 1  # operands are drawn from 2..max_operand
    ops = len(config.operators)
    combos = values**config.operands * ops ** (config.operands - 1)
    if combos > _ENUMERABLE:
        return config.correct_reward / values
    counts: dict[int, int] = {}
    numbers = range(2, config.max_operand + 1)
    for operands in itertools.product(numbers, repeat=config.operands):
        for operators in itertools.product(config.operators, repeat=config.operands - 1):
            text = " ".join(
                part
                for pair in itertools.zip_longest(map(str, operands), operators, fillvalue="")
                for part in pair
                if part
            )
            answer = int(evaluate(text))
            counts[answer] = counts.get(answer, 0) + 1
    return float(config.correct_reward * max(counts.values()) / combos)


@dataclasses.dataclass
class _Episode:
    config: CalculatorConfig
    answer: int
    turns: int = 0
    done: bool = False
    results: dict[int, Step] = dataclasses.field(default_factory=dict)


class Calculator:
    """One instance serves many concurrent episodes."""

    name = "calculator"

    def __init__(self) -> None:
        self._episodes: dict[str, _Episode] = {}

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = parse_config(CalculatorConfig, config, self.name)
        problem, answer = make_problem(seed, cfg)
        self._episodes[episode_id] = _Episode(config=cfg, answer=answer)
        prompt = f"What is {problem}? You may use the calculator tool. "
        if cfg.tool_hint:
            # A fixed example, not the problem: copying the hint must not solve the task.
            prompt += f"To use it, write {hint('12 * 7')} and wait for the result. "
        prompt += "When you know the result, reply with just the number."
        return Reset(
            messages=[{"role": "user", "content": prompt}],
            tools=[TOOL],
            info={"answer": answer, "problem": problem},
        )

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EnvironmentFailure(f"calculator: no episode {episode_id!r}; call reset first")
        if step in episode.results:  # a retried step: same answer, no second turn
            return episode.results[step]
        if episode.done:
            raise EnvironmentFailure(f"calculator: episode {episode_id!r} is already over")
        episode.turns += 1
        out_of_turns = episode.turns >= episode.config.max_turns
        if action.tool_calls:
            messages = [_run_tool(call) for call in action.tool_calls]
            result = Step(messages=messages, reward=0.0, done=out_of_turns, info={"solved": False})
        else:
            result = self._judge(episode, action.content, out_of_turns)
        episode.done = result.done
        episode.results[step] = result
        return result

    async def close(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)

    @staticmethod
    def _judge(episode: _Episode, content: str, out_of_turns: bool) -> Step:
        guess = last_number(content)
        if guess is None:
            reply = "Reply with the final answer as a number, or call the calculator."
            return Step([{"role": "user", "content": reply}], 0.0, out_of_turns, {"solved": False})
        solved = guess == episode.answer
        reward = episode.config.correct_reward if solved else 0.0
        return Step([], reward, True, {"solved": solved, "guess": guess})


def hint(expression: str) -> str:
    """A tool call in the Hermes/Qwen format (`rl_core.agent.toolcalls` parses it)."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _run_tool(call: ToolCall) -> Message:
    if call.name != "calculator":
        content = f"error: unknown tool {call.name!r}; the only tool is 'calculator'"
    else:
        expression = call.arguments.get("expression")
        if not isinstance(expression, str):
            content = "error: calculator needs a string argument 'expression'"
        else:
            try:
                content = format_number(evaluate(expression))
            except CalcError as exc:
                content = f"error: {exc}"
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}
