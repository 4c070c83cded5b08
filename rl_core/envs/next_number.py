"""``next_number``: each turn the environment says a number; the answer is that number plus one.

A game where reading is everything: the right answer of every turn depends only
on the number in that turn's observation, drawn afresh, so a policy that does
not read earns what a constant guess earns (`best_blind_reward`), and one that
reads earns the whole reward (`best_expected_reward`). It is the learning test's
proof that the pipeline teaches a policy to act on what the environment says;
`guess_number` on a small range cannot show that (its blind bound is nearly its
optimum).

Each of ``turns`` turns: the user message is a number drawn uniformly from
[low, high]; the answer is the first integer in the assistant's message and is
right when it equals the number plus ``offset``. A right answer earns
``correct_reward / turns``; a bare number (the message is the number and
nothing else) earns ``format_reward / turns`` more, the pull toward short
answers that a random-init model needs (see `guess_number`). The numbers of an
episode come from its reset seed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.config import parse_config
from rl_core.envs.episodes import Episodes

_INTEGER = re.compile(r"-?\d+")
PROMPT = "Answer each number with the number after it."


@dataclasses.dataclass(frozen=True, kw_only=True)
class NextNumberConfig:
    low: int = 1
    high: int = 8
    turns: int = 4
    offset: int = 1  # 0: say the number back
    correct_reward: float = 1.0  # over the episode, for every turn right
    format_reward: float = 0.2  # over the episode, for every answer a bare number

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.turns < 1:
            raise ValueError("turns must be at least 1")


def best_expected_reward(config: NextNumberConfig) -> float:
    """What the optimal policy earns: every turn answered right with a bare number."""
    return config.format_reward + config.correct_reward


def best_blind_reward(config: NextNumberConfig) -> float:
    """The best expected reward of a policy that reads no observation, exactly.

    A blind policy's answer at each turn is fixed in advance, while the number
    it should answer is drawn uniformly and independently of every earlier turn,
    so each fixed answer is right with probability at most 1 / (high - low + 1):
    every bare answer plus that share of the correct reward.
    """
    return config.format_reward + config.correct_reward / (config.high - config.low + 1)


@dataclasses.dataclass
class _Episode:
    config: NextNumberConfig
    numbers: list[int]
    turn: int = 0

    @property
    def over(self) -> bool:
        return self.turn >= self.config.turns


class NextNumber:
    """The built-in game. One instance serves many concurrent episodes."""

    name = "next_number"

    def __init__(self) -> None:
        self._episodes: Episodes[_Episode] = Episodes(self.name)

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = parse_config(NextNumberConfig, config, self.name)
        rng = random.Random(seed)
        numbers = [rng.randint(cfg.low, cfg.high) for _ in range(cfg.turns)]
        self._episodes.start(episode_id, _Episode(config=cfg, numbers=numbers))
        messages = [{"role": "user", "content": f"{PROMPT}\n{numbers[0]}"}]
        return Reset(messages=messages, info={"numbers": numbers})

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return self._episodes.play(episode_id, step, lambda e: self._judge(e, action.content))

    async def close(self, episode_id: str) -> None:
        self._episodes.close(episode_id)

    @staticmethod
    def _judge(episode: _Episode, content: str) -> Step:
        cfg = episode.config
        expected = episode.numbers[episode.turn] + cfg.offset
        episode.turn += 1
        match = _INTEGER.search(content)
        answer = int(match.group()) if match else None
        right = answer == expected
        reward = cfg.correct_reward / cfg.turns if right else 0.0
        if answer is not None and content.strip() == str(answer):
            reward += cfg.format_reward / cfg.turns
        done = episode.over
        messages = [] if done else [{"role": "user", "content": str(episode.numbers[episode.turn])}]
        info = {"expected": expected, "answer": answer, "right": right, "turn": episode.turn}
        return Step(messages=messages, reward=reward, done=done, info=info)
