from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl_core.agent.toolcalls import parse_tool_calls, render_tool_call
from rl_core.envs import Action, ToolCall
from rl_core.envs.calculator import (
    Calculator,
    CalculatorConfig,
    best_blind_reward,
    best_reward,
    make_problem,
)
from rl_core.envs.safe_math import CalcError, evaluate, format_number
from rl_core.errors import EnvironmentFailure


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("7 // 2", 3),
        ("-3 ** 2", -9),
        ("sqrt(16)", 4.0),
        ("10 / 4", 2.5),
        ("max(1, 5, 3)", 5),
        ("6 \u00d7 7", 42),
    ],
)
def test_evaluate_arithmetic(text: str, value: float) -> None:
    assert evaluate(text) == value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("__import__('os')", "unknown function"),
        ("().__class__", "not allowed"),
        ("9 ** 9 ** 9", "exponent"),
        ("1 / 0", "division"),
        ("2 ^ 3", "write \\*\\*"),
        ("x + 1", "Name"),
        ("open('f')", "unknown function"),
        ("1e300 * 1e300", "out of range"),
        ("(-8) ** 0.5", "out of range"),
        ("", "empty"),
        ("1 +", "not an arithmetic"),
        ("True + 1", "not numbers"),
        ("1" * 300, "longer"),
    ],
)
def test_evaluate_refuses_what_is_not_bounded_arithmetic(text: str, reason: str) -> None:
    with pytest.raises(CalcError, match=reason):
        evaluate(text)


def test_format_number() -> None:
    assert (format_number(4.0), format_number(7), format_number(2 / 3)) == (
        "4",
        "7",
        "0.666666666667",
    )


def test_problems_are_seeded_and_follow_difficulty() -> None:
    easy = CalculatorConfig(difficulty="easy")
    assert make_problem(3, easy) == make_problem(3, easy)
    assert make_problem(3, easy) != make_problem(4, easy)
    text, value = make_problem(11, CalculatorConfig(difficulty="hard", operators="*"))
    assert text.count("*") == 3 and value == evaluate(text)
    assert CalculatorConfig(difficulty="easy", max_operand=5).max_operand == 5


def episode(replies: list[Action], config: dict[str, Any] | None = None) -> list[Any]:
    async def main() -> list[Any]:
        env = Calculator()
        out: list[Any] = [await env.reset("e", 7, config or {})]
        for i, action in enumerate(replies, start=1):
            out.append(await env.step("e", i, action))
        return out

    return asyncio.run(main())


def test_tool_then_answer_earns_the_reward() -> None:
    reset = episode([])[0]
    problem, answer = reset.info["problem"], reset.info["answer"]
    assert reset.tools[0]["function"]["name"] == "calculator"
    assert problem in reset.messages[0]["content"]
    (hinted,) = parse_tool_calls(reset.messages[0]["content"]).tool_calls  # the format is shown
    assert hinted.name == "calculator" and hinted.arguments == {"expression": "12 * 7"}
    plain = asyncio.run(Calculator().reset("e", 7, {"tool_hint": False}))
    assert "<tool_call>" not in plain.messages[0]["content"]
    call = parse_tool_calls(render_tool_call("calculator", {"expression": problem}), id_prefix="t1")
    _, tool, final = episode([call.to_action(), Action(content=f"It is {answer}.")])
    assert tool.messages == [
        {"role": "tool", "tool_call_id": "t1_0", "name": "calculator", "content": str(answer)}
    ]
    assert (tool.done, tool.reward) == (False, 0.0)
    assert (final.done, final.reward, final.info["solved"]) == (True, 1.0, True)


def test_wrong_answer_and_tool_errors() -> None:
    bad_calls = Action(
        content="",
        tool_calls=(
            ToolCall("a", "calculator", {"expression": "1/0"}),
            ToolCall("b", "search", {}),
            ToolCall("c", "calculator", {}),
        ),
    )
    _, tool, wrong = episode([bad_calls, Action(content="-1")])
    assert [m["content"] for m in tool.messages] == [
        "error: division by zero",
        "error: unknown tool 'search'; the only tool is 'calculator'",
        "error: calculator needs a string argument 'expression'",
    ]
    assert (wrong.done, wrong.reward) == (True, 0.0)


def test_no_number_asks_again_until_out_of_turns() -> None:
    steps = episode([Action(content="hmm")] * 2, {"max_turns": 2})
    assert steps[1].done is False and "number" in steps[1].messages[0]["content"]
    assert steps[2].done is True and steps[2].reward == 0.0


def test_retried_step_is_not_a_second_turn_and_bad_config_is_typed() -> None:
    async def main() -> None:
        env = Calculator()
        await env.reset("e", 1, {"max_turns": 1})
        first = await env.step("e", 1, Action(content="no number"))
        assert await env.step("e", 1, Action(content="other")) is first
        with pytest.raises(EnvironmentFailure, match="already over"):
            await env.step("e", 2, Action(content="1"))
        with pytest.raises(EnvironmentFailure, match="unknown config keys"):
            await env.reset("f", 1, {"level": 3})
        with pytest.raises(EnvironmentFailure, match="difficulty"):
            await env.reset("f", 1, {"difficulty": "insane"})

    asyncio.run(main())


def test_the_blind_bound_is_exact_on_small_problems_and_an_upper_bound_on_large() -> None:
    """No policy that ignores the problem beats ``best_blind_reward``; the optimum is 1."""
    easy = CalculatorConfig(difficulty="easy")
    # a + b and a - b over 2..99: 101 and 0 are each hit by 98 of the 98 * 98 * 2 draws.
    assert best_blind_reward(easy) == pytest.approx(98 / (98 * 98 * 2))
    assert best_reward(easy) == 1.0
    # Brute force over seeds agrees with the enumeration: no fixed answer does better.
    answers = [make_problem(seed, easy)[1] for seed in range(20_000)]
    top = max(answers.count(a) for a in set(answers)) / len(answers)
    assert top == pytest.approx(best_blind_reward(easy), abs=0.003)
    # Where enumeration is too large, the bound 1 / (max_operand - 1) holds above the exact
    # value, checked on a configuration small enough to enumerate both ways.
    small = CalculatorConfig(difficulty="medium", max_operand=12)
    bound = small.correct_reward / (small.max_operand - 1)
    assert best_blind_reward(small) <= bound
    assert best_blind_reward(CalculatorConfig(difficulty="medium")) == pytest.approx(1 / 998)


TOOL_TASK = {"operators": "*", "max_operand": 999, "require_tool": True, "call_reward": 0.2}


def test_with_require_tool_only_an_answer_the_calculator_returned_counts() -> None:
    reset = episode([], TOOL_TASK)[0]
    problem, answer = reset.info["problem"], reset.info["answer"]
    # Right from its own head: no reward, not solved (and no tool use to report).
    (head,) = episode([Action(content=str(answer))], TOOL_TASK)[1:]
    assert (head.reward, head.info["solved"], head.info["used_tool"]) == (0.0, False, False)
    # A call that returns something else, then the right number: still not derived from it.
    other = parse_tool_calls(render_tool_call("calculator", {"expression": "2 * 3"}))
    _, off, late = episode([other.to_action(), Action(content=str(answer))], TOOL_TASK)
    assert (off.reward, late.reward, late.info["solved"]) == (0.0, 0.0, False)
    # The loop the task teaches: a call that returns the answer (paid once), then the answer.
    call = parse_tool_calls(render_tool_call("calculator", {"expression": problem}))
    _, tool, again, final = episode(
        [call.to_action(), call.to_action(), Action(content=f"The answer is {answer}")], TOOL_TASK
    )
    assert (tool.reward, again.reward) == (0.2, 0.0)  # the stepping stone is paid once
    assert (final.reward, final.info["solved"], final.info["used_tool"]) == (1.0, True, True)
    assert best_reward(CalculatorConfig(**TOOL_TASK)) == 1.2


def test_the_demonstration_shows_one_worked_exchange_before_the_question() -> None:
    reset = episode([], {**TOOL_TASK, "demonstration": True})[0]
    roles = [m["role"] for m in reset.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    (shown,) = parse_tool_calls(reset.messages[1]["content"]).tool_calls
    assert shown.arguments == {"expression": "23 * 41"}
    assert reset.messages[2]["content"] == reset.messages[3]["content"] == "943"
    assert reset.info["problem"] in reset.messages[-1]["content"]
    assert "23 * 41" not in reset.messages[-1]["content"].split("?")[0]  # its own problem
    with pytest.raises(ValueError, match="call_reward"):
        CalculatorConfig(call_reward=2.0)
