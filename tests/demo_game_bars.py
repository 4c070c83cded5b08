"""The demo game's learning bars, shared by the two tests that train on it (the built-in
environment's and the one played through sessions). Computed from the game, not guessed:
the last 10 steps average at least 3x the first 10, at least 0.8 of the optimal policy's
expected reward, and more than a uniform random guess each turn; "proven" is all three
held by the ten steps before each of five steps in a row (so that one lucky step cannot
end a run). `StopWhenProven` stops a run at the step boundary after that, as the CLI's
Ctrl-C does: the steps after it prove nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rl_core.envs.guess_number import (
    GuessNumberConfig,
    best_expected_reward,
    random_guess_reward,
)
from rl_core.host.control import RunControl
from rl_core.pipeline.files import RunFiles
from rl_core.pipeline.result import TrainResult
from rl_core.pipeline.runner import train
from rl_core.spec import JobSpec


class DemoGameBars:
    def __init__(self, game: GuessNumberConfig, times: int = 5) -> None:
        self.best, self.blind, self.times = (
            best_expected_reward(game),
            random_guess_reward(game),
            times,
        )

    def met_once(self, rewards: list[float]) -> bool:
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        return last >= 3 * first and last >= 0.8 * self.best and last > self.blind

    def met(self, rewards: list[float]) -> bool:
        n, times = len(rewards), self.times
        return n >= 20 + times - 1 and all(self.met_once(rewards[: n - k]) for k in range(times))

    def proven_at(self, rewards: list[float]) -> int | None:
        """The first step count at which the bars were met, or None."""
        return next((n for n in range(20, len(rewards) + 1) if self.met(rewards[:n])), None)

    def report(self, rewards: list[float]) -> str:
        first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
        return (
            f"steps {len(rewards)} proven at {self.proven_at(rewards)}  first-10 {first:.3f}  "
            f"last-10 {last:.3f}  (best {self.best:.3f}, random {self.blind:.3f})"
        )


class Bars(Protocol):
    def met(self, rewards: list[float]) -> bool:
        """Whether the rewards so far (one a step) prove the claim."""
        ...


class StopWhenProven(RunFiles):
    """`RunFiles` that asks ``control`` to stop once ``bars`` are met."""

    def __init__(self, out: Path, bars: Bars, control: RunControl) -> None:
        super().__init__(out)
        self.bars, self.control, self.seen = bars, control, list[float]()

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        super().on_step(step, metrics)
        self.seen.append(metrics["reward/mean"])
        if self.bars.met(self.seen):
            self.control.request_stop()


def train_until_proven(
    spec: JobSpec, bars: Bars, out: Path
) -> tuple[TrainResult, list[dict[str, Any]]]:
    """Run ``spec`` with its files in ``out``, stopped once ``bars`` are met; the run's
    result and its metrics rows."""
    control = RunControl()
    files = StopWhenProven(out, bars, control)
    try:
        result = train(spec, sink=files, control=control, artifacts_dir=out)
    finally:
        files.close()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return result, rows
