"""Candidate default settings on games rlaas did not write (issue #31, item 7).

    .venv/bin/python bench/heldout_defaults.py [--games guess,nim]
        [--candidates shipped,turn,reading] [--steps 30] [--parallel 2] [--seeds 0]

Each (game, candidate, seed) is one run of the shipped SmolLM2 recipe
(examples/smollm2-tool-use.yaml's model, LoRA, optimiser, group and batch, async with
staleness 1) on a TextArena game through examples/textarena_env.py, the adapter a user
would write, in a process of its own (``--parallel`` at a time, each pinned to its share
of the cores when they fit). The run is the real pipeline (`train_to_folder`: the engine,
the agent, the collector, the trainer); the adapter is registered in that process as the
environment ``textarena`` rather than served over HTTP (tests/sdk/test_textarena_env.py
serves it), since the transport changes no learning. The games were not written for
rlaas and no setting was tuned on them:

- ``guess``: TextArena's ``GuessTheNumber-v0`` (1 to 20, 10 guesses, hints 'higher' /
  'lower'; 1 for the number, otherwise how close the last guess was). Binary search
  wins every game within 5 guesses (optimum 1.0).
- ``guess-format``: the same game, the system prompt asking for the move's format
  (``[7]``), 16 new tokens a turn.
- ``nim``: TextArena's ``Nim-v0`` (piles 3, 4, 5; whoever takes the last object wins,
  +1 / -1) against an opponent playing uniformly random legal moves. The first player
  wins every game with Nim's xor rule (optimum 1.0); a player moving at random too
  earns `nim_random_value` (exact).

The candidates differ only in the algorithm's credit and exploration settings:

- ``shipped``: the spec's algorithm as it is (the defaults: the episode's advantage on
  every turn, the group's baseline, no entropy term);
- ``turn``: ``credit: turn`` (each turn its own return-to-go against the group's);
- ``reading``: examples/reading-game.yaml's: turn credit, the batch's baseline,
  clip-higher 0.28 and an entropy floor (``entropy_coef: 0.05, entropy_floor: 0.3``).

Reported per run: the training reward's mean over steps 0-4 and over the last 10, and
the held-out greedy evaluation (the spec's fixed evaluation games) at step 0 and at the
end. Not a test: the evidence for docs/learning.md's defaults.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))
from bench._processes import run_all  # noqa: E402 (after the path above)

RECIPE = REPO / "examples" / "smollm2-tool-use.yaml"
GAMES: dict[str, dict[str, Any]] = {
    "guess": {
        "environment": {"name": "textarena", "config": {"game": "GuessTheNumber-v0"}},
        "agent": {"max_turns": 10, "max_new_tokens": 64, "max_context": 1536},
    },
    # The same game with a system prompt that asks for the move's format, as a user whose
    # model answers in prose would write one (SmolLM2-135M then writes a bracketed number
    # in about 5 of 12 first turns, against 2 of 12 with the recipe's system prompt), and
    # turns as short as a move needs.
    "guess-format": {
        "environment": {"name": "textarena", "config": {"game": "GuessTheNumber-v0"}},
        "agent": {
            "system_prompt": "Answer with your guess only, written as a number in square "
            "brackets like [7]. Do not write anything else.",
            "max_turns": 10,
            "max_new_tokens": 16,
            "max_context": 1536,
        },
    },
    "nim": {
        "environment": {
            "name": "textarena",
            "config": {"game": "Nim-v0", "opponent": "random"},
        },
        "agent": {"max_turns": 8, "max_new_tokens": 64, "max_context": 1024},
    },
}
CANDIDATES: dict[str, dict[str, Any]] = {
    "shipped": {},
    "turn": {"credit": "turn"},
    "reading": {
        "credit": "turn",
        "baseline": "batch",
        "clip_eps_high": 0.28,
        "entropy_coef": 0.05,
        "entropy_floor": 0.3,
    },
}


@functools.cache
def _nim_value(piles: tuple[int, ...], mover: int) -> float:
    """Player 0's expected reward from here, both players moving uniformly at random."""
    moves = [
        tuple(p - q if j == i else p for j, p in enumerate(piles))
        for i, size in enumerate(piles)
        for q in range(1, size + 1)
    ]
    values = []
    for after in moves:
        if not any(after):
            values.append(1.0 if mover == 0 else -1.0)  # the mover took the last object
        else:
            values.append(_nim_value(after, 1 - mover))
    return sum(values) / len(values)


def nim_random_value(piles: tuple[int, ...] = (3, 4, 5)) -> float:
    """What a uniformly random player 0 earns in ``nim`` against the random opponent."""
    return _nim_value(tuple(sorted(piles)), 0)


def spec_for(
    game: str, candidate: str, seed: int, steps: int, cut_turn: str = "end"
) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(RECIPE.read_text())
    data["name"] = f"heldout-{game}-{candidate}"
    data["environment"] = GAMES[game]["environment"]
    data["agent"].update(GAMES[game]["agent"], cut_turn=cut_turn)
    data["algorithm"].update(CANDIDATES[candidate])
    data["train"].update(steps=steps, seed=seed, eval_interval=steps, eval_episodes=32)
    return data


def run_one(spec_path: Path, out: Path) -> None:
    """The child: one run, the adapter registered as the environment ``textarena``."""
    from textarena_env import TextArena

    import rl_core.envs as envs
    from rl_core.pipeline.runner import train_to_folder
    from rl_core.spec import parse_spec

    envs.BUILTINS["textarena"] = TextArena
    train_to_folder(parse_spec(yaml.safe_load(spec_path.read_text())), out)


def summary(out: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r["reward/mean"] for r in rows if "reward/mean" in r]
    evals = {r["step"]: r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r}
    first, last = min(evals, default=None), max(evals, default=None)
    return {
        "steps": len(train),
        "first5": statistics.mean(train[:5]) if train else float("nan"),
        "last10": statistics.mean(train[-10:]) if train else float("nan"),
        "eval_start": evals.get(first) if first is not None else float("nan"),
        "eval_end": evals.get(last) if last is not None else float("nan"),
        "curve": train,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", default="guess,nim")
    parser.add_argument("--candidates", default="shipped,turn,reading")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, help="a folder for the runs' files")
    parser.add_argument(
        "--cut-turn",
        choices=("end", "send"),
        default="end",
        help="agent.cut_turn: send a turn cut at max_new_tokens to the game as its move "
        "(SmolLM2 answers these prompts in prose: cut turns, truncated episodes, no signal)",
    )
    parser.add_argument("--one", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(*args.one)
        return 0
    work = args.out or Path(tempfile.mkdtemp(prefix="rlaas-heldout-"))
    jobs = []
    for key in [
        (g, c, s)
        for s in args.seeds
        for g in args.games.split(",")
        for c in args.candidates.split(",")
    ]:
        folder = work / "-".join(map(str, key))
        folder.mkdir(parents=True, exist_ok=True)
        spec = spec_for(*key, args.steps, args.cut_turn)
        (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
        command = [sys.executable, __file__, "--one", str(folder / "spec.yaml"),
                   str(folder / "run")]  # fmt: skip
        jobs.append((key, command, folder / "log.txt"))
    results: dict[tuple[str, str, int], dict[str, Any]] = {}

    def done(key: tuple[str, str, int], code: int, minutes: float) -> None:
        results[key] = summary(work / "-".join(map(str, key)) / "run") | {"minutes": minutes}
        print(f"{key}: exit {code}, {json.dumps(results[key])}", flush=True)

    run_all(jobs, parallel=args.parallel, cwd=REPO, done=done)
    print(f"\nfiles in {work}; nim: optimum 1.0, random play {nim_random_value():.3f}")
    print(f"{'game':>12} {'candidate':>9} {'seed':>4} {'steps 0-4':>9} {'last 10':>8} "
          f"{'eval start':>10} {'eval end':>8} {'min':>5}")  # fmt: skip
    for (game, candidate, seed), r in sorted(results.items()):
        print(f"{game:>12} {candidate:>9} {seed:>4} {r['first5']:>9.3f} {r['last10']:>8.3f} "
              f"{r['eval_start']:>10.3f} {r['eval_end']:>8.3f} {r['minutes']:>5.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
