from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl_core.envs import Action, Environment, WebhookTarget, build_environment
from rl_core.envs.calculator import Calculator
from rl_core.envs.guess_number import GuessNumber
from rl_core.envs.scored import Scored
from rl_core.envs.webhook import WebhookEnvironment
from rl_core.errors import EnvironmentFailure, UnknownEnvironment
from rl_core.rewards import RewardContext, parse_reward, score
from rl_core.spec import EnvironmentSpec, SpecError, parse_spec


def ctx(final: str, reference: Any = "42", turns: int = 1) -> RewardContext:
    return RewardContext(
        contents=(final,), reference=reference, env_reward=0.5, turns=turns, info={}
    )


def test_parse_and_score_weighted_terms() -> None:
    terms = parse_reward("numeric_match + length_penalty:0.01+env:2")
    assert [(t.name, t.weight) for t in terms] == [
        ("numeric_match", 1.0),
        ("length_penalty", 0.01),
        ("env", 2.0),
    ]
    values = score(terms, ctx("it is 42."))
    assert values == pytest.approx({"numeric_match": 1.0, "length_penalty": -0.09, "env": 1.0})


@pytest.mark.parametrize(
    ("name", "final", "reference", "value"),
    [
        ("exact_match", "  Paris. ", "paris", 1.0),
        ("exact_match", "It is Paris", "paris", 0.0),
        ("contains", "It is Paris", "paris", 1.0),
        ("numeric_match", "1,234.0", 1234, 1.0),
        ("numeric_match", "about 41", 42, 0.0),
        ("numeric_match", "none", 42, 0.0),
    ],
)
def test_matchers(name: str, final: str, reference: Any, value: float) -> None:
    assert score(parse_reward(name), ctx(final, reference))[name] == value


@pytest.mark.parametrize("text", ["nope", "exact_match:abc", "exact_match:inf"])
def test_bad_reward_is_a_422_naming_the_field(text: str) -> None:
    with pytest.raises(SpecError, match=r"environment\.reward"):
        parse_spec({"environment": {"name": "calculator", "reward": text}})


def test_scored_replaces_the_env_reward_at_the_end() -> None:
    async def main() -> list[Any]:
        env = Scored(Calculator(), parse_reward("exact_match+turn_penalty"))
        reset = await env.reset("e", 3, {})
        answer = reset.info["answer"]
        first = await env.step("e", 1, Action(content="no idea"))
        again = await env.step("e", 1, Action(content="other"))
        final = await env.step("e", 2, Action(content=str(answer)))
        return [first, again, final]

    first, again, final = asyncio.run(main())
    assert first is again and first.reward == 0.0
    assert final.done and final.reward == pytest.approx(1.0 - 0.1)
    assert final.info["reward_terms"] == pytest.approx({"exact_match": 1.0, "turn_penalty": -0.1})


def test_reward_needing_a_reference_fails_the_episode_clearly() -> None:
    async def main() -> None:
        env = Scored(GuessNumber(), parse_reward("exact_match"))
        await env.reset("e", 1, {"max_turns": 1})
        with pytest.raises(EnvironmentFailure, match="no 'answer'"):
            await env.step("e", 1, Action(content="3"))

    asyncio.run(main())


def test_build_environment_builtins_webhooks_and_rewards() -> None:
    calc = build_environment(EnvironmentSpec(name="calculator"))
    assert isinstance(calc, Calculator)
    scored = build_environment(EnvironmentSpec(name="code_exec", reward="env+length_penalty"))
    assert isinstance(scored, Scored) and isinstance(scored, Environment)
    target = WebhookTarget(id="env_ab", url="http://127.0.0.1:1", secret="s" * 16)
    hook = build_environment(
        EnvironmentSpec(name="env_ab", webhook={"retries": 0}), webhooks={"env_ab": target}
    )
    assert isinstance(hook, WebhookEnvironment) and hook.policy.retries == 0
    with pytest.raises(UnknownEnvironment, match="no URL"):
        build_environment(EnvironmentSpec(name="env_cd"), webhooks={"env_ab": target})
    with pytest.raises(UnknownEnvironment, match="calculator"):
        build_environment(EnvironmentSpec(name="chess"))
