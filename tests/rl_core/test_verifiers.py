"""The dataset verifiers of rl_core.rewards, and how a failing checker fails the episode."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.scored import Scored, run_tests
from rl_core.errors import EnvironmentFailure
from rl_core.rewards import (
    RewardContext,
    VerifierFailed,
    boxed,
    parse_reward,
    register_reward,
    score_async,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def ctx(final: str, reference: Any, **info: Any) -> RewardContext:
    return RewardContext(
        contents=(final,),
        reference=reference,
        env_reward=0.0,
        turns=1,
        info=info,
        sandbox=run_tests,
    )


async def value(name: str, final: str, reference: Any, **info: Any) -> float:
    return (await score_async(parse_reward(name), ctx(final, reference, **info)))[name]


@pytest.mark.parametrize(
    ("final", "reference", "expected"),
    [
        ("So the answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("The total is $12$ apples, so \\boxed{12}", "12", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("x = 3 so 2x = 6. The answer is 6", "6", 1.0),  # no LaTeX: the expression
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2", 1.0),
        ("I do not know", "7", 0.0),
    ],
)
async def test_math(final: str, reference: str, expected: float) -> None:
    assert await value("math", final, reference) == expected


@pytest.mark.parametrize(
    ("name", "final", "reference", "info", "expected"),
    [
        ("exact", "The capital is... \\boxed{ Paris }", "paris", {}, 1.0),
        ("exact", "Paris, France", "paris", {}, 0.0),
        ("regex", "\\boxed{2026-12-05}", r"\d{4}-\d{2}-\d{2}", {}, 1.0),
        ("regex", "on 2026-12-05, I think", r"\d{4}-\d{2}-\d{2}", {}, 0.0),
        ("numeric", "about 3.14", 3.14159, {"tolerance": 0.01}, 1.0),
        ("numeric", "about 3.14", 3.14159, {}, 0.0),
        ("numeric", "no number", 1, {}, 0.0),
    ],
)
async def test_exact_regex_numeric(
    name: str, final: str, reference: Any, info: dict[str, Any], expected: float
) -> None:
    assert await value(name, final, reference, **info) == expected


SCHEMA = {"type": "object", "required": ["name", "age"], "properties": {"age": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        ('```json\n{"name": "Ada", "age": 36}\n```', 1.0),
        ('{"name": "Ada", "age": "36"}', 0.0),  # parses, does not validate
        ("Ada is 36", 0.0),  # does not parse
    ],
)
async def test_json_schema(final: str, expected: float) -> None:
    assert await value("json_schema", final, SCHEMA) == expected
    assert await value("json_schema", final, __import__("json").dumps(SCHEMA)) == expected


TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


async def test_python_tests_in_the_sandbox() -> None:
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert await value("python_tests", good, TESTS) == 1.0
    assert await value("python_tests", bad, TESTS) == 0.0
    assert await value("python_tests", "raise SystemExit(3)", TESTS) == 0.0


def test_boxed_takes_the_last_balanced_one() -> None:
    assert boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert boxed("no box") is None and boxed("\\boxed{open") is None


def _raises(_: RewardContext) -> float:
    raise RuntimeError("checker bug")


def _slow(_: RewardContext) -> float:
    time.sleep(0.5)
    return 1.0


register_reward("test_raises", _raises)
register_reward("test_slow", _slow, slow=True)


async def test_a_checker_that_raises_or_times_out_is_a_failure_not_a_zero() -> None:
    with pytest.raises(VerifierFailed) as raised:
        await score_async(parse_reward("exact+test_raises"), ctx("a", "a"))
    assert (raised.value.name, raised.value.reason) == ("test_raises", "error")
    with pytest.raises(VerifierFailed) as slow:
        await score_async(parse_reward("test_slow"), ctx("a", "a"), timeout_s=0.05)
    assert slow.value.reason == "timeout"


class _OneTurn:
    async def reset(self, episode_id: str, seed: int, config: Any) -> Reset:
        return Reset(messages=[{"role": "user", "content": "q"}], info={"answer": "a"})

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return Step([], 0.0, True)

    async def close(self, episode_id: str) -> None:
        pass


async def test_scored_fails_the_episode_and_counts_the_reason() -> None:
    env = Scored(_OneTurn(), parse_reward("exact+test_raises"))
    for episode in ("e1", "e2"):
        await env.reset(episode, 0, {})
        with pytest.raises(EnvironmentFailure, match="checker bug"):
            await env.step(episode, 0, Action(content="a"))
    assert env.step_metrics() == {"env/verifier_failed/test_raises/error": 2.0}
    assert env.step_metrics() == {"env/verifier_failed/test_raises/error": 0.0}
    ok = Scored(_OneTurn(), parse_reward("exact"))
    await ok.reset("e", 0, {})
    assert (await ok.step("e", 0, Action(content="\\boxed{A}"))).reward == 1.0


class Ticker:
    """Counts the event loop's turns while a check runs: none means the check held it."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.ticks = every_s, 0

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self.ticks += 1

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()


async def test_a_slow_math_check_does_not_block_the_event_loop() -> None:
    async with Ticker(0.001) as ticker:
        await value("math", "\\boxed{\\frac{1}{3} + \\frac{1}{6}}", "1/2")
    assert ticker.ticks > 0


async def test_a_backtracking_pattern_fails_the_check_and_leaves_the_loop_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    import rl_core.rewards as rewards

    monkeypatch.setattr(rewards, "REGEX_TIMEOUT_S", 0.3)
    threads = threading.active_count()
    started = time.monotonic()
    async with Ticker(0.01) as ticker:
        with pytest.raises(VerifierFailed) as failed:  # backtracking: Fibonacci(60) paths
            await value("regex", "a" * 60 + "!", r"(a|aa)+$")
    assert failed.value.reason == "timeout" and "ran past 0.3 s" in failed.value.detail
    assert time.monotonic() - started < 5  # the match stopped itself at its deadline
    assert ticker.ticks >= 10  # the event loop ran meanwhile
    await asyncio.sleep(0.05)
    assert threading.active_count() <= threads + 1  # no matching thread left running
