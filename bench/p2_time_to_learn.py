"""P2: the time SmolLM2 takes to reach a held-out target on the tool-use spec, the
trainer's old path against its new one, in one invocation.

    .venv/bin/python bench/p2_time_to_learn.py [--spec examples/smollm2-tool-use.yaml]
        [--variants before,after] [--target 0.9] [--max-steps 10] [--eval-episodes 64]

Each variant is the spec run through the real pipeline (`train_to_folder`: the JAX
engine, the agent, the async collector, the LoRA GRPO trainer) in a fresh process of
its own, with the held-out evaluation (greedy, the spec's fixed problems) after every
step, and stops at the first step whose held-out accuracy (``eval/solved``) reaches
the target or at ``--max-steps``. The variants differ only in the trainer's settings
(`TrainerConfig`, which the spec does not expose: the bench swaps
`rl_core.pipeline.configs.trainer_config` for one that sets them):

- ``before``: the trainer as it was when #35 was filed: every position's logits at
  once (``logits_chunk=None``), LoRA merged into the kernels for every forward
  (``lora_apply="merged"``), every member of a group running the group's prompt
  (``share_prefix=False``), the output head at every position
  (``head_positions="all"``), rows padded and never packed (``pack=False``), every
  new step shape compiled (``fit_compiled=False``);
- ``after``: today's defaults: the head at the trained positions, in chunks, LoRA beside
  the kernels, and each step laid out shared (a group's prompt computed once) where that
  computes at most half packing's positions, else packed (`Trainer._layout_choice`).

Both pad their batches to today's length bucket (quarter octaves of the longest row, the
pipeline's `configs.TRAIN_LENGTH_BUCKET`, not a trainer setting): the ``before`` trainer
ran on power-of-two buckets, so its figure here is a little better than the old run's.

Reported per variant: the step at which the target was first met, the wall time to
the end of that step's train step, the same less the evaluations' own time (every
step is evaluated here, which a run would not do), the median train step, and the
held-out curve. The rollouts sample at the spec's temperature from the same seed, but
the two trainers' float32 arithmetic differs in its order, so the runs can part ways
after the first update: the steps to the target are each run's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import REPO, table
from rl_core.pipeline.files import read_timeline

SPEC = REPO / "examples" / "smollm2-tool-use.yaml"
VARIANTS: dict[str, dict[str, Any]] = {
    "before": {
        "logits_chunk": None,
        "lora_apply": "merged",
        "share_prefix": False,
        "head_positions": "all",
        "pack": False,
        "fit_compiled": False,
    },
    "after": {},
}


class ReachedTarget(Exception):
    """Raised from the metrics sink to end a run at its first step on target."""


def run_variant(variant: str, spec_path: Path, out: Path, target: float, steps: int,
                episodes: int) -> None:  # fmt: skip
    """The child: one variant's run, in this process."""
    import rl_core.pipeline.configs as configs
    from rl_core.pipeline.runner import train_to_folder
    from rl_core.spec import parse_spec
    from rl_core.training.trainer import TrainerConfig

    plain = configs.trainer_config
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    overrides = {k: v for k, v in VARIANTS[variant].items() if k in fields}
    skipped = sorted(set(VARIANTS[variant]) - set(overrides))
    print(f"{variant}: trainer overrides {overrides}; not in this build: {skipped}", flush=True)

    def patched(spec: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(plain(spec, **kwargs), **overrides)

    configs.trainer_config = patched  # type: ignore[assignment]
    data = yaml.safe_load(spec_path.read_text())
    data["train"].update(steps=steps, eval_interval=1, eval_episodes=episodes)
    # The parent stops the run with a SIGINT once a step is on target (train_to_folder's
    # Ctrl-C: a stop at the next step boundary); the figures end at that step's span.
    train_to_folder(parse_spec(data), out)


def on_target(out: Path, target: float) -> bool:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return False
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return any(r["step"] > 0 and r.get("eval/solved", 0.0) >= target for r in rows)


def figures(out: Path, target: float) -> dict[str, Any]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = {r["step"]: r.get("eval/solved", 0.0) for r in rows if "eval/episodes" in r}
    reached = next((s for s, v in sorted(curve.items()) if s > 0 and v >= target), None)
    timeline = read_timeline(out / "timeline.json")
    start = min(s.start_us for s in timeline)
    train = {s.step: s for s in timeline if s.name == "train_step"}
    last = reached if reached is not None else max(train)
    end = train[last].start_us + train[last].dur_us
    eval_us = sum(s.dur_us for s in timeline if s.name == "eval" and s.start_us < end)
    steps_s = [train[s].dur_us / 1e6 for s in sorted(train) if s <= last]
    return {
        "reached": reached,
        "wall_s": (end - start) / 1e6,
        "net_s": (end - start - eval_us) / 1e6,
        "median_step_s": statistics.median(steps_s),
        "curve": curve,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=SPEC)
    parser.add_argument("--variants", default="before,after")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="a folder for the runs' files")
    args = parser.parse_args()
    if args.one:
        run_variant(args.one, args.spec, args.out, args.target, args.max_steps,
                    args.eval_episodes)  # fmt: skip
        return 0
    root = args.out or Path(tempfile.mkdtemp(prefix="rlaas-p2-"))
    results = {}
    for variant in args.variants.split(","):
        out = root / variant
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, __file__, "--one", variant, "--out", str(out), "--spec",
             str(args.spec), "--target", str(args.target), "--max-steps",
             str(args.max_steps), "--eval-episodes", str(args.eval_episodes)],
        )  # fmt: skip
        stopping = False
        while child.poll() is None:
            time.sleep(2.0)
            if not stopping and on_target(out, args.target):
                child.send_signal(signal.SIGINT)  # a stop at the next step boundary
                stopping = True
        if child.returncode != 0:
            raise RuntimeError(f"the {variant} run exited {child.returncode}")
        results[variant] = figures(out, args.target)
        print(f"{variant}: process {time.perf_counter() - started:.0f} s, {results[variant]}",
              flush=True)  # fmt: skip
    rows = []
    for variant, f in results.items():
        curve = " ".join(f"{s}:{v:.2f}" for s, v in sorted(f["curve"].items()))
        rows.append([variant, str(f["reached"] or f"not by {args.max_steps}"),
                     f"{f['wall_s'] / 60:.1f}", f"{f['net_s'] / 60:.1f}",
                     f"{f['median_step_s']:.1f}", curve])  # fmt: skip
    print(table(["variant", f"first step >= {args.target}", "wall min", "less evals min",
                 "median train step s", "held-out by step"], rows))  # fmt: skip
    if "before" in results and "after" in results:
        b, a = results["before"], results["after"]
        print(f"after/before, less evals: {a['net_s'] / b['net_s']:.2f}x the time "
              f"({b['net_s'] / a['net_s']:.2f}x faster)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
