"""TextArena's games as an rlaas environment, written as a user would write one.

    pip install "textarena==0.7.4"
    export RLAAS_ENV_SECRET=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    PYTHONPATH=examples rlaas env serve textarena_env:TextArena --port 9000
    rlaas env register textarena http://127.0.0.1:9000   # prints the env_... id

and name that id as a spec's ``environment.name``, with ``environment.config``:

- ``game``: a TextArena id, e.g. ``GuessTheNumber-v0`` or ``Nim-v0`` (the raw game is
  used: rlaas keeps the conversation, so TextArena's history wrappers are not needed);
- ``kwargs``: the game's own arguments over the registered ones (``{max_turns: 6}``);
- ``opponent``: for a two-player game, how the other player moves: ``random`` (a
  uniformly random legal move; only for the games in ``OPPONENTS``).

The model plays player 0. Each turn's user message is what TextArena showed that player
since its last move (the rules, hints, the board, the opponent's move, a warning after
an invalid move); the reward is TextArena's for player 0 when the game ends, 0 before.
bench/heldout_defaults.py trains on these games; they were not written for rlaas and
no setting was tuned on them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from rl_core.errors import EnvironmentFailure

AGENT = 0


def _nim_random(env: Any, rng: random.Random) -> str:
    """A uniformly random legal Nim move, in Nim's own action format."""
    piles = env.state.game_state["piles"]
    moves = [(i, q) for i, size in enumerate(piles) for q in range(1, size + 1)]
    i, q = rng.choice(moves)
    return f"[{i} {q}]"


OPPONENTS: dict[str, Callable[[Any, random.Random], str]] = {"Nim": _nim_random}


class _Game:
    def __init__(self, config: Mapping[str, Any], seed: int) -> None:
        import textarena as ta

        game = config.get("game")
        if not isinstance(game, str):
            raise EnvironmentFailure("config.game: name a TextArena game, e.g. GuessTheNumber-v0")
        kwargs = config.get("kwargs") or {}
        try:
            self.env = ta.make(f"{game}-raw", **kwargs)
        except (ValueError, TypeError, ImportError) as exc:
            raise EnvironmentFailure(f"config.game {game!r}: {exc}") from exc
        family = game.split("-")[0]
        self.opponent: Callable[[Any, random.Random], str] | None = None
        self.rng = random.Random(seed)
        players = 1
        if config.get("opponent") is not None:
            if config["opponent"] != "random" or family not in OPPONENTS:
                raise EnvironmentFailure(
                    f"config.opponent: only 'random', for the games {sorted(OPPONENTS)}"
                )
            self.opponent = OPPONENTS[family]
            players = 2
        self.env.reset(num_players=players, seed=seed)

    def observe(self) -> str:
        """What player 0 was shown since its last move. Players' raw moves are left out, as
        TextArena's own wrappers leave them out: the game's messages describe each move."""
        import textarena as ta

        _, items = self.env.get_observation()
        return "\n".join(
            message.strip()
            for _sender, message, kind in items
            if kind != ta.ObservationType.PLAYER_ACTION and message.strip()
        )

    def play(self, text: str) -> tuple[bool, float]:
        done, _ = self.env.step(action=text)
        while not done and self.env.state.current_player_id != AGENT:
            assert self.opponent is not None
            done, _ = self.env.step(action=self.opponent(self.env, self.rng))
        if not done:
            return False, 0.0
        rewards, _ = self.env.close()
        return True, float(rewards.get(AGENT, 0.0)) if rewards else 0.0


class TextArena:
    """One instance serves many episodes at once, one TextArena game each."""

    def __init__(self) -> None:
        self._games: dict[str, _Game] = {}
        # TextArena seeds Python's global `random` in reset: one game set up at a time.
        self._lock = asyncio.Lock()

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        async with self._lock:
            game = _Game(config, seed)  # player 0, the model, moves first in these games
            self._games[episode_id] = game
            return Reset(messages=[{"role": "user", "content": game.observe()}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        game = self._games.get(episode_id)
        if game is None:
            raise EnvironmentFailure(f"episode {episode_id!r} is not open: reset it first")
        async with self._lock:
            done, reward = game.play(action.content)
            text = "" if done else game.observe()
        if done:
            self._games.pop(episode_id, None)
        return Step(
            messages=[{"role": "user", "content": text}] if text else [],
            reward=reward,
            done=done,
        )

    async def close(self, episode_id: str) -> None:
        self._games.pop(episode_id, None)
