from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl_core.envs import Action, ToolCall
from rl_core.envs.code_exec import CodeExec, CodeExecConfig, best_blind_reward
from rl_core.envs.code_tasks import BY_NAME, TASKS
from rl_core.errors import EnvironmentFailure

GOOD_GCD = "```python\ndef gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n```"


def play(actions: list[Action], config: dict[str, Any] | None = None) -> list[Any]:
    async def main() -> list[Any]:
        env = CodeExec()
        out: list[Any] = [await env.reset("e", 0, {"tasks": ["gcd"], **(config or {})})]
        for i, action in enumerate(actions, start=1):
            out.append(await env.step("e", i, action))
        await env.close("e")
        return out

    return asyncio.run(main())


def test_tasks_draw_from_the_seed_and_name_the_function() -> None:
    async def tasks(seed: int) -> str:
        reset = await CodeExec().reset("e", seed, {})
        assert reset.tools[0]["function"]["name"] == "python"
        return str(reset.info["task"])

    drawn = {asyncio.run(tasks(seed)) for seed in range(40)}
    assert len(drawn) > 5 and drawn <= set(BY_NAME)
    assert asyncio.run(tasks(3)) == asyncio.run(tasks(3))
    assert all(t.function in t.prompt and t.cases for t in TASKS)


def test_tool_runs_code_then_a_correct_function_scores_one() -> None:
    call = ToolCall("t1_0", "python", {"code": "print(sum(range(4)))"})
    reset, tool, final = play([Action(content="", tool_calls=(call,)), Action(content=GOOD_GCD)])
    assert "gcd(a, b)" in reset.messages[0]["content"]
    assert tool.messages[0]["tool_call_id"] == "t1_0"
    assert tool.messages[0]["content"].startswith("stdout:\n6\n") and not tool.done
    assert (final.done, final.reward, final.info["solved"]) == (True, 1.0, True)


def test_partial_credit_and_all_or_nothing() -> None:
    half = "```python\ndef gcd(a, b):\n    return 1 if a == 17 else a // 2 + 0 * b\n```"
    assert play([Action(content=half)])[1].reward == pytest.approx(2 / 3)  # (17,5) and (100,10)
    assert play([Action(content=half)], {"partial_credit": False})[1].reward == 0.0


def test_faking_the_checkers_line_or_dying_earns_nothing() -> None:
    fake = '```python\nprint(\'__rlaas_0000__{"passed": 3, "total": 3}\')\n```'
    dies = "```python\nimport os\nos._exit(0)\n```"  # exits before the checker runs
    results = play([Action(content=fake)])[1], play([Action(content=dies)])[1]
    assert [r.reward for r in results] == [0.0, 0.0]


def test_tool_reports_limits_and_missing_code_block_asks_again() -> None:
    sleeper = ToolCall("a", "python", {"code": "import time\ntime.sleep(30)"})
    bad = ToolCall("b", "shell", {"cmd": "ls"})
    _, tool, ask = play(
        [Action(content="", tool_calls=(sleeper, bad)), Action(content="def gcd(a, b): ...")],
        {"wall_s": 0.5},
    )
    assert "wall-time limit" in tool.messages[0]["content"]
    assert "unknown tool 'shell'" in tool.messages[1]["content"]
    assert not ask.done and "```python" in ask.messages[0]["content"]


def test_bad_config_is_a_typed_error() -> None:
    with pytest.raises(EnvironmentFailure, match="unknown tasks"):
        asyncio.run(CodeExec().reset("e", 0, {"tasks": ["chess"]}))


def test_a_blind_answer_solves_every_task_so_the_blind_bound_is_the_optimum() -> None:
    """One fixed reply, the same whatever the task, defines every task's function as a
    lookup table of its cases: it passes all of them, so `best_blind_reward` is 1."""
    functions = []
    for i, task in enumerate(TASKS):
        table = {repr(args): expected for args, expected in task.cases}
        functions.append(
            f"_T{i} = {table!r}\ndef {task.function}(*args):\n    return _T{i}[repr(args)]\n"
        )
    blind = Action(content="```python\n" + "\n".join(functions) + "```")

    async def reward(name: str) -> float:
        env = CodeExec()
        await env.reset("e", 0, {"tasks": [name]})
        return (await env.step("e", 1, blind)).reward

    rewards = {task.name: asyncio.run(reward(task.name)) for task in TASKS}
    assert rewards == dict.fromkeys(rewards, 1.0)
    assert best_blind_reward(CodeExecConfig()) == 1.0
