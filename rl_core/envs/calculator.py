"""``calculator``: arithmetic word problems with a calculator tool, for instruct models.

Multi-turn: the model may call ``calculator`` (a Hermes/Qwen tool call, see
`rl_core.agent.toolcalls`) any number of times, reads the results as ``tool``
messages, then answers in plain text. The episode ends at the first message
without tool calls; its last number is the answer, and the reward is
``correct_reward`` if it is right, else 0. Problems are drawn from the reset
seed, so a seed always gives the same problem. ``difficulty`` picks the
defaults of the other keys; any key given explicitly wins.

For teaching a model to use the tool (not just to answer):

- ``require_tool``: an answer counts only if the calculator returned that very
  number in this episode (a right answer from the model's own head earns 0
  and is not ``solved``), so the reward credits answers derived from a tool
  result;
- ``call_reward``: paid once, on the turn whose calculator call first returns
  the answer (the model wrote an expression equal to the problem), a
  stepping stone for a model that rarely finishes the whole loop at first;
- ``demonstration``: the prompt opens with one worked exchange on a fixed
  other problem (question, tool call, tool result, bare answer), for chat
  templates that drop the ``tools`` list: a 135M model shown the format once
  writes a well-formed call in about 4 of 10 samples, against none when it is
  only described.

``info`` reports ``used_tool`` (the calculator returned the answer) with
``solved`` at the episode's end.
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
    require_tool: bool = False
    call_reward: float = 0.0
    demonstration: bool = False

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
        if not 0.0 <= self.call_reward <= self.correct_reward:
            raise ValueError("call_reward must be between 0 and correct_reward")


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
    """The optimum: every problem can be solved (with the tool, or by hand), and a
    call that returns the answer can always come first."""
    return config.correct_reward + config.call_reward


# Problems up to this many operand/operator combinations are enumerated exactly.
_ENUMERABLE = 2_000_000


def best_blind_reward(config: CalculatorConfig) -> float:
    """The best expected reward of a policy that reads no observation (the problem
    included): exact where the problems can be enumerated, else a proven upper bound.

    A blind policy's final answer is a fixed number ``a`` (its tool calls return results
    it does not read), and its calls are fixed expressions, so it earns at most
    ``best_reward * P(answer = a)``, best at the most likely answer. Bound: given
    everything but the last operand, the answer is an affine function of it with a
    nonzero integer slope (+-1, or +- the product it ends), so a fixed answer matches
    at most one of its ``max_operand - 1`` equally likely values:
    ``P(answer = a) <= 1 / (max_operand - 1)``.
    """
    assert config.operands and config.max_operand and config.operators  # __post_init__
    values = config.max_operand - 1  # operands are drawn from 2..max_operand
    ops = len(config.operators)
    combos = values**config.operands * ops ** (config.operands - 1)
    if combos > _ENUMERABLE:
        return best_reward(config) / values
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
    return float(best_reward(config) * max(counts.values()) / combos)


@dataclasses.dataclass
class _Episode:
    config: CalculatorConfig
    answer: int
    turns: int = 0
    done: bool = False
    tool_returned_answer: bool = False
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
        messages = _demonstration(cfg) if cfg.demonstration else []
        messages.append({"role": "user", "content": _question(problem, cfg)})
        return Reset(messages=messages, tools=[TOOL], info={"answer": answer, "problem": problem})

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
            found = any(_returned(m, episode.answer) for m in messages)
            paid = found and not episode.tool_returned_answer
            episode.tool_returned_answer |= found
            reward = episode.config.call_reward if paid else 0.0
            info = {"solved": False, "used_tool": episode.tool_returned_answer}
            result = Step(messages=messages, reward=reward, done=out_of_turns, info=info)
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
        used_tool = episode.tool_returned_answer
        solved = guess == episode.answer and (used_tool or not episode.config.require_tool)
        reward = episode.config.correct_reward if solved else 0.0
        return Step([], reward, True, {"solved": solved, "guess": guess, "used_tool": used_tool})


def _question(problem: str, cfg: CalculatorConfig) -> str:
    prompt = f"What is {problem}? You may use the calculator tool. "
    if cfg.tool_hint:
        # A fixed example, not the problem: copying the hint must not solve the task.
        prompt += f"To use it, write {hint('12 * 7')} and wait for the result. "
    return prompt + "When you know the result, reply with just the number."


# The worked exchange of ``demonstration``, answered the way the reward wants. A task
# that draws this very problem is shown its answer; with `require_tool` that earns
# nothing until the model calls the tool itself.
_DEMO_PROBLEM = "23 * 41"


def _demonstration(cfg: CalculatorConfig) -> list[Message]:
    value = format_number(evaluate(_DEMO_PROBLEM))
    call = ToolCall(id="demo", name="calculator", arguments={"expression": _DEMO_PROBLEM})
    return [
        {"role": "user", "content": _question(_DEMO_PROBLEM, cfg)},
        {"role": "assistant", "content": hint(_DEMO_PROBLEM)},
        _run_tool(call),
        {"role": "assistant", "content": value},
    ]


def _returned(message: Message, answer: int) -> bool:
    """Whether a calculator result message is the answer."""
    try:
        return float(str(message.get("content", ""))) == answer
    except ValueError:
        return False


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
