"""D1: single-turn RLVR on a dataset: episodes/s and the trainer's busy share, sync
against async in one invocation, and what the verifier adds per episode.

    .venv/bin/python bench/d1_dataset.py                 # both parts (tens of minutes)
    .venv/bin/python bench/d1_dataset.py --verifier-only # part 1 only (seconds)
    .venv/bin/python bench/d1_dataset.py --steps 4       # part 2, shorter

Part 1, the verifier: 1,000 answers to generated arithmetic problems (a third right
and boxed, a third right as a plain last number, a third wrong), each scored by the
``math`` verifier (math-verify) as a run scores it (`rewards.score_async`: a thread
hop, under the verifier's limit), beside the ``numeric`` verifier (a regex and a float
compare) on the same answers. Reports microseconds per episode, mean and p99.

Part 2, the pipeline: ``examples/smollm2-arithmetic.yaml`` (SmolLM2-135M-Instruct with
LoRA on reasoning-gym's basic_arithmetic, the ``dataset`` environment) run through the
real pipeline (`train_to_folder`) twice, ``staleness.mode: sync`` then ``async``, the
same steps and seed, no evaluation. From each run's metrics: episodes per second of
wall over the steps after the first (the first compiles), and the trainer's busy share
(``trainer/busy_frac`` weighted by step time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import table
from rl_core.rewards import RewardContext, parse_reward, score_async

SPEC = Path(__file__).resolve().parents[1] / "examples" / "smollm2-arithmetic.yaml"


def _answers(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(reply, reference) pairs: right and boxed, right as a plain number, wrong."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        a, b = rng.randint(-99, 99), rng.randint(1, 99)
        reference = str(a + b)
        kind = i % 3
        if kind == 0:
            reply = f"First add {a} and {b}. The answer is \\boxed{{{a + b}}}."
        elif kind == 1:
            reply = f"<answer>{a + b}</answer>"
        else:
            reply = f"{a} + {b} = {a + b + rng.randint(1, 9)}"
        pairs.append((reply, reference))
    return pairs


async def _time_verifier(name: str, pairs: list[tuple[str, str]]) -> list[float]:
    terms = parse_reward(name)
    took = []
    for reply, reference in pairs:
        ctx = RewardContext(
            contents=(reply,), reference=reference, env_reward=0.0, turns=1, info={}
        )
        start = time.perf_counter()
        await score_async(terms, ctx)
        took.append(time.perf_counter() - start)
    return took


def verifier_part(n: int) -> None:
    pairs = _answers(n)
    asyncio.run(_time_verifier("math", pairs[:20]))  # imports and sympy's caches
    rows = []
    for name in ("numeric", "math"):
        took = asyncio.run(_time_verifier(name, pairs))
        took_us = sorted(t * 1e6 for t in took)
        p99 = took_us[int(0.99 * (len(took_us) - 1))]
        rows.append([name, f"{statistics.fmean(took_us):.0f}", f"{p99:.0f}"])
    print(f"verifier cost per episode, {n} answers (score_async, as a run scores them)")
    print(table(["verifier", "mean us", "p99 us"], rows))


def _run(data: dict, mode: str, steps: int) -> dict[str, float]:
    from rl_core.pipeline.runner import train_to_folder
    from rl_core.spec import parse_spec

    data = json.loads(json.dumps(data))
    data["staleness"]["mode"] = mode
    data["train"].update(steps=steps, eval_interval=0)
    spec = parse_spec(data)
    out = Path(tempfile.mkdtemp(prefix=f"rlaas-d1-{mode}-"))
    started = time.perf_counter()
    train_to_folder(spec, out)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in rows if "step_time_s" in r and r.get("step", 0) > 1]
    seconds = sum(r["step_time_s"] for r in steady)
    return {
        "wall_s": wall,
        "steps": len(steady),
        "episodes_s": spec.batch_size * len(steady) / seconds,
        "step_s": seconds / len(steady),
        "busy": sum(r["trainer/busy_frac"] * r["step_time_s"] for r in steady) / seconds,
    }


def pipeline_part(steps: int) -> None:
    data = yaml.safe_load(SPEC.read_text())
    results = {mode: _run(data, mode, steps) for mode in ("sync", "async")}
    print(f"\n{SPEC.name}: SmolLM2-135M-Instruct + LoRA, {steps} steps a mode, "
          "steps after the first")  # fmt: skip
    print(
        table(
            ["mode", "steps", "episodes/s", "s/step", "trainer busy", "wall s"],
            [
                [
                    mode,
                    str(r["steps"]),
                    f"{r['episodes_s']:.2f}",
                    f"{r['step_s']:.1f}",
                    f"{r['busy']:.0%}",
                    f"{r['wall_s']:.0f}",
                ]
                for mode, r in results.items()
            ],
        )
    )
    ratio = results["async"]["episodes_s"] / results["sync"]["episodes_s"]
    print(f"async / sync episodes/s: {ratio:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verifier-only", action="store_true")
    parser.add_argument("--answers", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    verifier_part(args.answers)
    if not args.verifier_only:
        pipeline_part(args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
