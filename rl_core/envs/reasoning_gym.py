"""``reasoning_gym``: a dataset of reasoning-gym (PyPI ``reasoning-gym``, 0.1.x) as an environment.

reasoning-gym generates tasks procedurally: a dataset built from a config and a
seed holds ``size`` tasks, each ``{"question", "answer", "metadata"}``, and
scores an answer with its own ``score_answer`` (1.0 right, less for wrong or
partly right). An episode here is the task at index ``reset seed % size``, so
the same seed gives the same task (a GRPO group shares it). The question is the
user message; the model's answer is what it writes inside
``<answer></answer>`` when it uses the tags (reasoning-gym's own
``extract_answer``), its whole text otherwise; the reward is the dataset's
score of it. With ``attempts`` above 1 a wrong answer gets the task again and
the last answer's score is the reward, so a task may take several turns.

The config (`rl_core.protocol.ecosystem.ReasoningGymConfig`) is checked when
the run is submitted; the dataset's own config is checked as the environment
is built (reasoning-gym raises for an unknown key or a bad value), so a bad one
fails the run before its first episode. Importing reasoning-gym takes seconds
(it loads every dataset module): it happens then, once, not on an episode's path.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.episodes import Episodes
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.ecosystem import (
    REASONING_GYM,
    ConfigProblem,
    ReasoningGymConfig,
    parse_config,
)

RETRY = "That answer is not right (score {score:.2f}). Try again."


def load_dataset(config: ReasoningGymConfig) -> Any:
    """The reasoning-gym dataset ``config`` names, or `EnvironmentFailure` saying what to
    change (the package missing, a key its config class lacks, a value it refuses)."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError as exc:
        raise EnvironmentFailure(
            f"{REASONING_GYM}: the reasoning-gym package is not installed on this worker "
            f"({exc}); install rlaas[worker] (it pins reasoning-gym)"
        ) from None
    _, config_cls = DATASETS[config.dataset]
    known = sorted(f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size"))
    unknown = sorted(set(config.dataset_config) - set(known))
    if unknown:
        raise EnvironmentFailure(
            f"{REASONING_GYM}: environment.config.dataset_config has keys {unknown} that "
            f"dataset {config.dataset!r} does not take; its keys are {known}"
        )
    try:
        return reasoning_gym.create_dataset(
            config.dataset, **config.dataset_config, seed=config.seed, size=config.size
        )
    except (AssertionError, TypeError, ValueError) as exc:  # its config's validate() asserts
        raise EnvironmentFailure(
            f"{REASONING_GYM}: dataset {config.dataset!r} refused environment.config."
            f"dataset_config {config.dataset_config}: {exc or type(exc).__name__}"
        ) from None


def extract(text: str) -> str:
    """The answer in ``text``: inside the last ``<answer></answer>`` when there is one
    (reasoning-gym's own reading), else the whole text, stripped."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    return tagged if tagged is not None else text.strip()


def score(dataset: Any, entry: dict[str, Any], content: str) -> tuple[str, float]:
    """The answer in ``content`` (`extract`) and the dataset's own score of it for
    ``entry``: 1.0 right, less for wrong or partly right. The ``dataset`` environment's
    procedural sources score with it too."""
    answer = extract(content)
    return answer, float(dataset.score_answer(answer, entry))


@dataclasses.dataclass
class _Episode:
    dataset: Any  # scores the entry's answers
    entry: dict[str, Any]
    attempts_left: int
    finished: bool = False

    @property
    def over(self) -> bool:
        return self.finished


class ReasoningGym:
    """One instance serves the run's episodes; datasets are built once per distinct config."""

    name = REASONING_GYM

    def __init__(self) -> None:
        self._episodes: Episodes[_Episode] = Episodes(self.name)
        self._datasets: dict[str, tuple[ReasoningGymConfig, Any]] = {}

    def prepare(self, config: Mapping[str, Any]) -> None:
        """Build the dataset of ``config`` now (the run's build calls it), so a bad config
        fails the run at its start and no episode waits on the import."""
        self._dataset(config)

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        cfg, dataset = self._dataset(config)
        index = seed % cfg.size
        entry = dataset[index]
        episode = _Episode(dataset=dataset, entry=entry, attempts_left=cfg.attempts)
        self._episodes.start(episode_id, episode)
        messages: list[dict[str, Any]] = []
        if cfg.system_prompt is not None:
            messages.append({"role": "system", "content": _system_prompt(cfg.system_prompt)})
        messages.append({"role": "user", "content": entry["question"]})
        return Reset(messages=messages, info={"dataset": cfg.dataset, "index": index})

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        return self._episodes.play(episode_id, step, lambda e: self._judge(e, action.content))

    async def close(self, episode_id: str) -> None:
        self._episodes.close(episode_id)

    def _dataset(self, config: Mapping[str, Any]) -> tuple[ReasoningGymConfig, Any]:
        key = json.dumps(dict(config), sort_keys=True, default=str)
        found = self._datasets.get(key)
        if found is None:
            try:
                cfg = parse_config(REASONING_GYM, dict(config))
            except ConfigProblem as exc:
                raise EnvironmentFailure(f"{REASONING_GYM}: {exc}") from None
            found = self._datasets[key] = (cfg, load_dataset(cfg))
        return found

    @staticmethod
    def _judge(episode: _Episode, content: str) -> Step:
        answer, value = score(episode.dataset, episode.entry, content)
        episode.attempts_left -= 1
        done = episode.finished = value >= 1.0 or episode.attempts_left <= 0
        messages = [] if done else [{"role": "user", "content": RETRY.format(score=value)}]
        info = {"answer": answer, "expected": episode.entry.get("answer"), "score": value}
        return Step(messages=messages, reward=value if done else 0.0, done=done, info=info)


def _system_prompt(name: str) -> str:
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if name not in SYSTEM_PROMPTS:
        raise EnvironmentFailure(
            f"{REASONING_GYM}: environment.config.system_prompt {name!r} is not one of "
            f"reasoning-gym's SYSTEM_PROMPTS: {sorted(SYSTEM_PROMPTS)}"
        )
    return str(SYSTEM_PROMPTS[name])


__all__ = ["ReasoningGym", "extract", "load_dataset", "score"]
