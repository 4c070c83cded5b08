"""THE integration test of the pipeline: from random init, the tiny model learns guess_number.

The run is ``examples/tiny-game.yaml`` (async mode), seeded, a bounded number
of steps, written through the files of ``rlaas train --out``. Learned means:
the mean reward of the last 10 steps is at least 3x that of the first 10, and
at least 0.8 of the best achievable. "Best achievable" is exact: the expected
reward of the optimal policy for the spec's game (solved = 1.0, less
``turn_penalty`` per extra turn, plus the small per-guess format reward), from
`rl_core.envs.guess_number.best_expected_reward`; no policy beats it on average.

In a game this small, guessing blind also scores well (the spec's game: 0.847
of a best 1.058, about 0.8 of it), so learned also means beating blind play
(`random_guess_reward`, exact too): the hints are read. The seed fixes the
games and the samples, not which episodes finish first, so async runs of one
seed differ. With 8 games a step (the spec until 2026-12-03) about one run in
ten failed: it collapsed onto one answer (entropy 0.01, no group disagreed,
so nothing to learn from) or sat near blind play (~0.78) past step 200. The
spec now takes 16 games a step and an entropy floor: twelve runs of it
(2026-12-03) reached 0.98 by steps 40-70, ended at last-10 means of
1.038-1.058, and no ten steps after step 100 fell below 1.017. The bar is
blind play itself, which the issue's 0.8 of best nearly is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl_core.envs.guess_number import (
    GuessNumberConfig,
    best_expected_reward,
    random_guess_reward,
)
from rl_core.pipeline.runner import train_to_folder
from rl_core.spec import load_spec

EXAMPLE = Path(__file__).parents[3] / "examples" / "tiny-game.yaml"


# About 3 minutes of 2 idle cores; the default 600 s limit is too tight when others share them.
@pytest.mark.timeout(1500)
def test_the_tiny_model_learns_the_multi_turn_game_in_async_mode(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    assert spec.staleness.mode == "async" and spec.train.steps <= 200
    game = GuessNumberConfig.from_mapping(spec.environment.config)
    best, blind = best_expected_reward(game), random_guess_reward(game)

    result = train_to_folder(spec, tmp_path)
    assert result.steps_completed == spec.train.steps

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, spec.train.steps + 1))
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"first-10 {first:.3f}  last-10 {last:.3f}  best {best:.3f}  blind {blind:.3f}")
    assert last >= 3 * first
    assert last >= 0.8 * best
    assert last > blind

    # The same run's timeline, metrics and trajectories came out of the sinks.
    assert max(r["staleness/max"] for r in rows) <= spec.staleness.max_staleness
    assert all("trainer/busy_frac" in r and "engine/busy_frac" in r for r in rows)
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    stages = {e["name"] for e in timeline["traceEvents"] if e["ph"] == "X"}
    assert {
        "rollout",
        "model_call",
        "env_step",
        "queue_wait",
        "train_step",
        "weight_sync",
    } <= stages
    records = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    solved = [r for r in records if r["step"] > spec.train.steps - 10 and r["info"].get("solved")]
    assert solved and any(seg["trained"] for seg in solved[0]["segments"])
