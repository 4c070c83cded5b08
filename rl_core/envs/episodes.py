"""The episodes a built-in environment serves at once, with the protocol's step idempotency.

``(episode_id, step)`` identifies a step: a retried step gets the answer it got
the first time and does not play the game again. `Episodes.play` does that
bookkeeping, so a game only judges a move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from rl_core.envs.base import Step
from rl_core.errors import EnvironmentFailure


class EpisodeState(Protocol):
    @property
    def over(self) -> bool: ...


E = TypeVar("E", bound=EpisodeState)


class Episodes(Generic[E]):
    def __init__(self, env_name: str) -> None:
        self._env = env_name
        self._states: dict[str, E] = {}
        self._answers: dict[str, dict[int, Step]] = {}

    def start(self, episode_id: str, state: E) -> None:
        self._states[episode_id] = state
        self._answers[episode_id] = {}

    def play(self, episode_id: str, step: int, judge: Callable[[E], Step]) -> Step:
        """``judge(state)`` once per step; a retried step is answered from memory."""
        state = self._states.get(episode_id)
        if state is None:
            raise EnvironmentFailure(f"{self._env}: no episode {episode_id!r}; call reset first")
        answers = self._answers[episode_id]
        if step in answers:
            return answers[step]
        if state.over:
            raise EnvironmentFailure(f"{self._env}: episode {episode_id!r} is already over")
        answers[step] = judge(state)
        return answers[step]

    def close(self, episode_id: str) -> None:
        self._states.pop(episode_id, None)
        self._answers.pop(episode_id, None)
