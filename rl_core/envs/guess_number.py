"""``guess_number``: find a hidden integer in [low, high] from "higher" / "lower" hints.

Multi-turn on purpose: a good policy must read the environment's replies, not
only format an answer. The reward is shaped so a random-init model can learn
it from scratch: a well-formed guess (the message is a number and nothing
else) that the hints so far allow earns a little (``format_reward`` spread
over the turns), and the correct number earns
``correct_reward``, less ``turn_penalty`` per extra turn used, so fewer
guesses (a binary search) score higher than guessing through the range.

The answer is the first integer in the assistant's message ("5", "it is 5");
a message without one is told to answer with a number and still uses a turn.
Only a bare number earns the format reward: without that pull toward short
answers a learning policy keeps trailing filler tokens after its guess, its
entropy stays high, and one bad update can tip it into turns that never end
(truncated episodes score 0 and carry no learning signal). Only a guess the
hints allow earns it too: a guess the hints already rule out is wasted, and
saying so every turn is what teaches a small model to read the hints at all
(with the solve reward alone it settles on guessing through the range).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import re
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.episodes import Episodes
from rl_core.errors import EnvironmentFailure

_INTEGER = re.compile(r"-?\d+")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuessNumberConfig:
    low: int = 1
    high: int = 8
    max_turns: int = 4
    correct_reward: float = 1.0
    turn_penalty: float = 0.2  # taken off correct_reward per turn after the first
    format_reward: float = 0.1  # total over the episode for well-formed in-range guesses
    # "direction": the reply is "higher" or "lower", and the player must keep track of
    # the interval itself; "interval" adds what is left open ("higher, between 3 and 5").
    hints: str = "direction"

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.hints not in ("direction", "interval"):
            raise ValueError(f"hints must be 'direction' or 'interval', not {self.hints!r}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> GuessNumberConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise EnvironmentFailure(
                f"guess_number: unknown config keys {unknown}; known keys are {sorted(known)}"
            )
        return cls(**dict(config))


def best_expected_reward(config: GuessNumberConfig) -> float:
    """The expected episode reward of the optimal policy, targets uniform over [low, high].

    What "learned the game" is measured against: no policy does better on
    average. An optimal guess is always inside the interval the hints leave open.
    """
    return _expected_reward(config, optimal=True)


def random_guess_reward(config: GuessNumberConfig) -> float:
    """The expected episode reward of a uniform guess in [low, high] every turn.

    What a policy earns that has learned the answer format and nothing else. It
    reads no hints, but neither does the best blind policy (`best_blind_reward`),
    which earns more: a test that claims hints are read must beat that one.
    """
    return _expected_reward(config, optimal=False)


# Past this many sets of guesses the blind bound would take seconds: refuse instead.
MAX_BLIND_STATES = 100_000


def best_blind_reward(config: GuessNumberConfig) -> float:
    """The best expected episode reward of any observation-blind policy, exactly.

    A blind policy never reads a reply: it plays one fixed sequence of guesses
    (the game stops it at the right one). The best such sequence is the bar a
    learning test must clear to show that hints are read; on a small range it
    comes close to the optimum (1..3 in 4 turns: always 1, 2, 3 earns 1.05 of a
    best 1.058), on a large one it is far below (1..16 in 5 turns, the defaults:
    0.275 of 0.593).

    Dynamic programming over the set of numbers guessed so far. Repeating a
    guess earns nothing (it is wrong, so the hints rule it out), so the best
    sequence has no repeats, and what a next guess earns depends only on the
    set, not the order: for each target not yet guessed, the interval the hints
    leave open is bounded by the nearest guesses below and above it.
    """
    cfg, per_guess = config, config.format_reward / config.max_turns
    numbers = range(cfg.low, cfg.high + 1)
    n = len(numbers)
    states = sum(math.comb(n, k) for k in range(min(cfg.max_turns, n) + 1))
    if states > MAX_BLIND_STATES:
        raise ValueError(
            f"the blind bound of {n} numbers in {cfg.max_turns} turns has {states} states "
            f"(at most {MAX_BLIND_STATES}): use a smaller range or fewer turns"
        )

    @functools.cache
    def value(guessed: frozenset[int]) -> float:
        used = len(guessed)
        if used >= cfg.max_turns or used >= n:
            return 0.0
        solved = max(0.0, cfg.correct_reward - cfg.turn_penalty * used)
        open_games = [t for t in numbers if t not in guessed]  # a guessed target has ended
        intervals = [
            (
                max((g + 1 for g in guessed if g < t), default=cfg.low),
                min((g - 1 for g in guessed if g > t), default=cfg.high),
            )
            for t in open_games
        ]
        best = 0.0
        for guess in open_games:
            now = sum(per_guess for lo, hi in intervals if lo <= guess <= hi) + solved
            best = max(best, now / n + value(guessed | {guess}))
        return best

    return value(frozenset())


def _expected_reward(config: GuessNumberConfig, *, optimal: bool) -> float:
    """Dynamic programming over the interval [lo, hi] the hints leave open and the turns used.

    Given the hints so far the target is uniform over that interval. The
    optimal policy takes the best guess inside it; the random one averages
    over every guess in the whole range (a guess outside the interval earns
    nothing and leaves it as it was).
    """
    cfg, per_guess = config, config.format_reward / config.max_turns
    everything = range(cfg.low, cfg.high + 1)

    @functools.cache
    def value(lo: int, hi: int, used: int) -> float:
        if lo > hi or used >= cfg.max_turns:
            return 0.0
        n = hi - lo + 1
        solved = max(0.0, cfg.correct_reward - cfg.turn_penalty * used)

        def after(g: int) -> float:
            if not lo <= g <= hi:
                return value(lo, hi, used + 1)
            below, above = (
                (g - lo) * value(lo, g - 1, used + 1),
                (hi - g) * value(g + 1, hi, used + 1),
            )
            return per_guess + (solved + below + above) / n

        if optimal:
            return max(after(g) for g in range(lo, hi + 1))
        return sum(after(g) for g in everything) / len(everything)

    return value(cfg.low, cfg.high, 0)


@dataclasses.dataclass
class _Episode:
    config: GuessNumberConfig
    target: int
    lo: int  # the interval the hints so far leave open
    hi: int
    turns: int = 0
    over: bool = False


class GuessNumber:
    """The built-in game. One instance serves many concurrent episodes."""

    name = "guess_number"

    def __init__(self) -> None:
        self._episodes: Episodes[_Episode] = Episodes(self.name)

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg = GuessNumberConfig.from_mapping(config)
        target = random.Random(seed).randint(cfg.low, cfg.high)
        self._episodes.start(
            episode_id, _Episode(config=cfg, target=target, lo=cfg.low, hi=cfg.high)
        )
        prompt = f"Guess the number between {cfg.low} and {cfg.high}."
        return Reset(messages=[{"role": "user", "content": prompt}], info={"target": target})

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return self._episodes.play(episode_id, step, lambda e: self._judge(e, action.content))

    async def close(self, episode_id: str) -> None:
        self._episodes.close(episode_id)

    @staticmethod
    def _judge(episode: _Episode, content: str) -> Step:
        cfg = episode.config
        episode.turns += 1
        match = _INTEGER.search(content)
        guess = int(match.group()) if match else None
        reward = 0.0
        bare = guess is not None and content.strip() == str(guess)
        if bare and guess is not None and episode.lo <= guess <= episode.hi:
            reward += cfg.format_reward / cfg.max_turns
        if guess is None:
            reply = "Answer with a number."
        elif guess < episode.target:
            reply = "higher"
            episode.lo = max(episode.lo, guess + 1)
        elif guess > episode.target:
            reply = "lower"
            episode.hi = min(episode.hi, guess - 1)
        else:
            reply = "correct"
            reward += max(0.0, cfg.correct_reward - cfg.turn_penalty * (episode.turns - 1))
        if cfg.hints == "interval" and reply in ("higher", "lower"):
            reply += f", between {episode.lo} and {episode.hi}"
        episode.over = guess == episode.target or episode.turns >= cfg.max_turns
        info = {"guess": guess, "turns": episode.turns, "solved": guess == episode.target}
        return Step(
            messages=[{"role": "user", "content": reply}],
            reward=reward,
            done=episode.over,
            info=info,
        )
