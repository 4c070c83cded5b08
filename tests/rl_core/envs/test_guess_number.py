from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl_core.envs import Action, Environment, get_environment
from rl_core.envs.guess_number import GuessNumber
from rl_core.errors import EnvironmentFailure, UnknownEnvironment

CFG = {"low": 1, "high": 8, "max_turns": 3, "turn_penalty": 0.25, "format_reward": 0.3}


def play(seed: int, answers: list[str], config: dict[str, Any] = CFG) -> list[Any]:
    async def main() -> list[Any]:
        env = GuessNumber()
        reset = await env.reset("ep", seed, config)
        steps = [reset]
        for i, answer in enumerate(answers, start=1):
            steps.append(await env.step("ep", i, Action(content=answer)))
        await env.close("ep")
        return steps

    return asyncio.run(main())


def test_registry_returns_fresh_builtins() -> None:
    env = get_environment("guess_number")
    assert isinstance(env, Environment)
    assert env is not get_environment("guess_number")


@pytest.mark.parametrize("name", ["chess", "env_0123"])
def test_unknown_environment_is_a_typed_error_naming_it(name: str) -> None:
    with pytest.raises(UnknownEnvironment, match=name) as info:
        get_environment(name)
    assert "guess_number" in str(info.value)


def test_target_is_chosen_by_seed_within_range() -> None:
    targets = {s: play(s, [])[0].info["target"] for s in range(40)}
    assert set(targets.values()) <= set(range(1, 9))
    assert len(set(targets.values())) > 3
    assert all(play(s, [])[0].info["target"] == t for s, t in list(targets.items())[:5])


def test_prompt_names_the_range() -> None:
    reset = play(0, [], {"low": 3, "high": 12})[0]
    assert reset.messages == [{"role": "user", "content": "Guess the number between 3 and 12."}]


def test_higher_lower_correct_and_rewards() -> None:
    seed = next(s for s in range(100) if play(s, [])[0].info["target"] == 5)
    _, low, high, right = play(seed, ["2", "it is 7", "5"])
    assert [s.messages[0]["content"] for s in (low, high, right)] == ["higher", "lower", "correct"]
    assert [s.done for s in (low, high, right)] == [False, False, True]
    per_guess = 0.3 / 3  # format reward is spread over the turns
    assert low.reward == pytest.approx(per_guess)
    assert right.reward == pytest.approx(per_guess + 1.0 - 2 * 0.25)


def test_first_guess_right_scores_most() -> None:
    seed = next(s for s in range(100) if play(s, [])[0].info["target"] == 4)
    assert play(seed, ["4"])[1].reward == pytest.approx(0.1 + 1.0)


def test_no_number_and_out_of_range_earn_nothing_and_use_turns() -> None:
    seed = next(s for s in range(100) if play(s, [])[0].info["target"] == 3)
    _, none, far, last = play(seed, ["no idea", "99", "1"])
    assert none.messages[0]["content"] == "Answer with a number."
    assert far.messages[0]["content"] == "lower"
    assert none.reward == far.reward == 0.0
    assert last.done and not last.info["solved"]  # max_turns reached


def test_a_retried_step_does_not_advance_the_game() -> None:
    async def main() -> None:
        env = GuessNumber()
        await env.reset("ep", 0, CFG)
        first = await env.step("ep", 1, Action(content="1"))
        again = await env.step("ep", 1, Action(content="1"))
        assert again is first
        second = await env.step("ep", 2, Action(content="1"))
        assert second.info["turns"] == 2

    asyncio.run(main())


def test_bad_config_and_unknown_episode_fail_clearly() -> None:
    with pytest.raises(EnvironmentFailure, match="unknown config keys"):
        play(0, [], {"hgih": 3})
    with pytest.raises(EnvironmentFailure, match="call reset first"):
        asyncio.run(GuessNumber().step("nope", 1, Action(content="1")))
