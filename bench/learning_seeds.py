"""Seeded learning runs of one spec, against the bar its game's bounds set.

    .venv/bin/python -m bench.learning_seeds examples/reading-game.yaml --seeds 0 1 2 3 4
        [--steps N] [--parallel 2] [--set algorithm.lr_schedule=constant ...]

Each seed is one `rlaas train` of the spec with ``train.seed`` replaced, in a process of
its own (``--parallel`` at a time, each pinned to its share of the cores). Printed per
seed: the mean reward of the last 10 steps and of steps 41-50; then the bar a learning
test uses, blind + (optimal - blind) / 2 from the environment's exact bounds
(``best_blind_reward`` / ``best_expected_reward`` of ``guess_number`` and
``next_number``), and how many seeds clear it. Not a test: for choosing a spec that
learns in every seed before a test asserts it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench._processes import run_all

REPO = Path(__file__).resolve().parents[1]


def bar(spec: dict[str, Any]) -> tuple[float, float, float] | None:
    """(blind, optimal, bar) of the spec's game, or None for a game without bounds."""
    from rl_core.envs import guess_number, next_number
    from rl_core.envs.config import parse_config

    env = spec["environment"]
    config = env.get("config") or {}
    if env["name"] == "next_number":
        nn = parse_config(next_number.NextNumberConfig, config, "next_number")
        blind, best = next_number.best_blind_reward(nn), next_number.best_expected_reward(nn)
    elif env["name"] == "guess_number":
        gn = parse_config(guess_number.GuessNumberConfig, config, "guess_number")
        blind, best = guess_number.best_blind_reward(gn), guess_number.best_expected_reward(gn)
    else:
        return None
    return blind, best, blind + (best - blind) / 2


def held_from(rewards: list[float], line: float, times: int = 5) -> int | None:
    """The first step at which the last-10 mean had held ``line`` for ``times`` steps running
    (where a learning test that stops once proven would stop)."""
    means = [sum(rewards[n - 10 : n]) / 10 for n in range(10, len(rewards) + 1)]
    for i in range(len(means) - times + 1):
        if all(m >= line for m in means[i : i + times]):
            return i + 10 + times - 1
    return None


def with_setting(data: dict[str, Any], assignment: str) -> None:
    """``a.b.c=value`` (value read as YAML) into the nested spec."""
    path, _, raw = assignment.partition("=")
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], help="a.b=value, repeatable")
    args = parser.parse_args()
    base = yaml.safe_load(args.spec.read_text())
    for assignment in args.set:
        with_setting(base, assignment)
    if args.steps:
        base["train"]["steps"] = args.steps
    work = Path(tempfile.mkdtemp(prefix="rlaas-seeds-"))
    jobs = []
    for seed in args.seeds:
        data = json.loads(json.dumps(base))
        data["train"]["seed"] = seed
        folder = work / f"seed-{seed}"
        folder.mkdir()
        (folder / "spec.yaml").write_text(yaml.safe_dump(data))
        command = [sys.executable, "-m", "sdk.cli", "train", str(folder / "spec.yaml")]
        jobs.append((seed, [*command, "--out", str(folder / "run")], folder / "log.txt"))
    results: dict[int, list[float]] = {}

    def done(seed: int, code: int, minutes: float) -> None:
        rows = (work / f"seed-{seed}" / "run" / "metrics.jsonl").read_text().splitlines()
        rewards = [json.loads(r)["reward/mean"] for r in rows if '"reward/mean"' in r]
        results[seed] = rewards
        print(f"seed {seed}: exit {code}, {len(rewards)} steps, {minutes:.1f} min")

    run_all(jobs, parallel=args.parallel, cwd=REPO, done=done)

    bounds = bar(base)
    print(f"\n{args.spec.name} {' '.join(args.set)}; files in {work}")
    print(f"{'seed':>4} {'steps 41-50':>12} {'last 10':>8} {'held from':>9}")
    passed = 0
    for seed in args.seeds:
        rewards = results.get(seed, [])
        early = statistics.mean(rewards[40:50]) if len(rewards) >= 50 else float("nan")
        last = statistics.mean(rewards[-10:]) if rewards else float("nan")
        ok = bounds is not None and last >= bounds[2]
        passed += ok
        held = held_from(rewards, bounds[2]) if bounds else None
        print(f"{seed:>4} {early:>12.3f} {last:>8.3f} {held!s:>9} {'PASS' if ok else 'MISS'}")
    if bounds:
        blind, best, line = bounds
        print(f"blind {blind:.3f}, optimal {best:.3f}, bar {line:.4f}: {passed}/{len(args.seeds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
