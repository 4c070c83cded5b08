"""``next_number``: rewards per turn, retries, and exact bounds checked by playing it."""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
from typing import Any

import pytest

from rl_core.envs import Action, get_environment
from rl_core.envs.next_number import (
    PROMPT,
    NextNumber,
    NextNumberConfig,
    best_blind_reward,
    best_expected_reward,
)
from rl_core.errors import EnvironmentFailure

SMALL = {"low": 1, "high": 3, "turns": 2, "offset": 1, "format_reward": 0.2}


def test_the_registry_has_it() -> None:
    assert isinstance(get_environment("next_number"), NextNumber)


def test_each_turn_shows_a_number_and_pays_for_the_next_one() -> None:
    async def main() -> None:
        env = NextNumber()
        reset = await env.reset("ep", 7, {"turns": 3})
        numbers = reset.info["numbers"]
        assert len(numbers) == 3 and all(1 <= n <= 8 for n in numbers)
        assert reset.messages[0]["content"] == f"{PROMPT}\n{numbers[0]}"
        right = await env.step("ep", 1, Action(content=str(numbers[0] + 1)))
        assert right.reward == pytest.approx((1.0 + 0.2) / 3) and not right.done
        assert right.messages == [{"role": "user", "content": str(numbers[1])}]
        wordy = await env.step("ep", 2, Action(content=f"it is {numbers[1] + 1}"))
        assert wordy.reward == pytest.approx(1.0 / 3)  # right, but not a bare number
        wrong = await env.step("ep", 3, Action(content=str(numbers[2])))
        assert wrong.reward == pytest.approx(0.2 / 3) and wrong.done and wrong.messages == []
        again = await env.step("ep", 3, Action(content="anything"))
        assert again == wrong  # a retried step is answered the same, not played again
        with pytest.raises(EnvironmentFailure, match="already over"):
            await env.step("ep", 4, Action(content="1"))

    asyncio.run(main())


def test_the_same_seed_gives_the_same_numbers() -> None:
    async def numbers(seed: int) -> list[int]:
        return (await NextNumber().reset("ep", seed, {})).info["numbers"]

    assert asyncio.run(numbers(3)) == asyncio.run(numbers(3))


def test_bad_config_and_unknown_episode_fail_clearly() -> None:
    with pytest.raises(EnvironmentFailure, match="unknown config keys"):
        asyncio.run(NextNumber().reset("ep", 0, {"hi": 3}))
    with pytest.raises(EnvironmentFailure, match="must not exceed"):
        asyncio.run(NextNumber().reset("ep", 0, {"low": 5, "high": 2}))
    with pytest.raises(EnvironmentFailure, match="call reset first"):
        asyncio.run(NextNumber().step("nope", 1, Action(content="1")))


@functools.cache
def seed_per_draw(low: int, high: int, turns: int) -> dict[tuple[int, ...], int]:
    """A reset seed for every tuple of numbers: they are uniform, so their mean is exact."""
    seeds: dict[tuple[int, ...], int] = {}
    for seed in range(20_000):
        rng = random.Random(seed)
        seeds.setdefault(tuple(rng.randint(low, high) for _ in range(turns)), seed)
    assert len(seeds) == (high - low + 1) ** turns
    return seeds


def play(config: dict[str, Any], answer: Any) -> float:
    """Mean reward over every draw of numbers; ``answer(turn, shown)`` gives the reply."""

    async def main() -> float:
        env, total = NextNumber(), 0.0
        draws = seed_per_draw(config["low"], config["high"], config["turns"])
        for seed in draws.values():
            reset = await env.reset("ep", seed, config)
            shown = int(reset.messages[0]["content"].split("\n")[-1])
            for turn in range(1, config["turns"] + 1):
                step = await env.step("ep", turn, Action(content=str(answer(turn, shown))))
                total += step.reward
                if step.messages:
                    shown = int(step.messages[0]["content"])
            await env.close("ep")
        return total / len(draws)

    return asyncio.run(main())


def test_best_expected_reward_is_what_reading_every_number_earns() -> None:
    cfg = NextNumberConfig(**SMALL)
    assert play(SMALL, lambda turn, shown: shown + 1) == pytest.approx(best_expected_reward(cfg))


def test_best_blind_reward_is_the_best_fixed_sequence_played_for_real() -> None:
    answers = range(0, 6)
    played = [
        play(SMALL, lambda turn, shown, fixed=fixed: fixed[turn - 1])
        for fixed in itertools.product(answers, repeat=SMALL["turns"])
    ]
    cfg = NextNumberConfig(**SMALL)
    assert max(played) == pytest.approx(best_blind_reward(cfg))
    assert best_blind_reward(cfg) < best_expected_reward(cfg) / 2
