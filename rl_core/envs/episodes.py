"""The episodes a built-in environment serves at once, with the protocol's step idempotency.

``(episode_id, step)`` identifies a step: a retried step gets the answer it got
the first time and does not play the game again. `Episodes.play` does that
bookkeeping, so a game only judges a move.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

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


# Episode ids name the work they play (`rl_core.pipeline.collector` and
# `rl_core.pipeline.evaluate` make them with these): an environment whose problems are
# a fixed list (``dataset``) reads from the id which training task or which held-out
# episode it serves, so the rows follow the collector's own resumable order.
_TRAIN_ID = re.compile(r"g(\d+)-e\d+(?:-r\d+)?$")
_EVAL_ID = re.compile(r"eval\d+-e(\d+)(?:-s\d+)?$")


def train_episode_id(prefix: str, task: int, member: int, attempt: int = 0) -> str:
    suffix = f"-r{attempt}" if attempt else ""
    return f"{prefix}g{task}-e{member}{suffix}"


def eval_episode_id(prefix: str, step: int, index: int, sample: int = 0) -> str:
    """Held-out task ``index``'s sample ``sample`` (``train.eval_k`` samples per task; the
    first has no suffix, so a run with one sample names its episodes as before)."""
    suffix = f"-s{sample}" if sample else ""
    return f"{prefix}eval{step}-e{index}{suffix}"


def episode_position(episode_id: str) -> tuple[Literal["train", "eval"], int] | None:
    """("train", task index) or ("eval", held-out task index) from an id made above; None for
    any other id (a library user's own)."""
    if found := _EVAL_ID.search(episode_id):
        return "eval", int(found.group(1))
    if found := _TRAIN_ID.search(episode_id):
        return "train", int(found.group(1))
    return None
