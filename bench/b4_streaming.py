"""B4: GRPO groups stream into the trainer as they complete.

Candidate: ``async`` mode, max_staleness 3, so (M+1)·B groups start at once and
a group reaches the queue the moment its last episode ends; the first step
trains on the first B groups done. Baseline, same run, same seed:
wait-for-full-batch (``sync`` mode: B groups, the trainer waits for all of them).
Measured: seconds from the run's start to the first train step's start; and,
over every step, that no group was trained with an episode missing or still
running (checked in the device thread just before each train step).

Model: candidate ≈ the B-th smallest group latency of (M+1)·B; baseline ≈ the
largest of B (a group's latency: its slowest member; members share a plan).
Target: candidate ≤ 1/4 of baseline; zero partial groups.

    .venv/bin/python -m bench.b4_streaming --quick
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from bench._harness import PipeSpec, SleepTrainer, plan_stats, ratio, run_pipeline, table, verdict

G, B, M = 4, 4, 3


def run(quick: bool) -> list[str]:
    env = {
        "preset": "adversarial-tail",
        "base": "search",
        "time_scale": 1 / 60,
        "timeout_rate": 0.0,
        "reward": "fixed",
    }
    steps = 4 if quick else 12
    base = PipeSpec(
        env=env,
        group_size=G,
        batch_groups=B,
        concurrency=G * B,
        steps=steps,
        cap_s=60 if quick else 180,
    )
    specs = {
        "wait-for-full-batch (sync)": dataclasses.replace(base, mode="sync"),
        f"streaming (async, M={M})": dataclasses.replace(
            base, mode="async", max_staleness=M, concurrency=(M + 1) * G * B
        ),
    }
    runs = {k: run_pipeline(s, trainer=SleepTrainer(0.1)) for k, s in specs.items()}
    stats = plan_stats(env, 0.0, tasks=(M + 1) * B)
    w = stats.latencies
    pred = {"wait-for-full-batch (sync)": max(w[:B]), f"streaming (async, M={M})": sorted(w)[B - 1]}
    rows: list[list[Any]] = []
    for name, r in runs.items():
        first = r.trained[0].at_s if r.trained else float("nan")
        groups = sum(len(t.groups) for t in r.trained)
        rows.append([name, len(r.steps), first, pred[name], groups, r.partial_groups])
    frac = ratio(rows[1][2], rows[0][2])
    partial = rows[0][5] + rows[1][5]
    return [
        table(
            f"B4 GRPO streaming, adversarial-tail (sigma=1.5, no timeouts, scale 1/60), G={G}, "
            f"B={B}; model inputs "
            f"E[W]={plan_stats(env, 0.0, tasks=1024).mean:.3f}s, tail "
            f"CV={plan_stats(env, 0.0, tasks=1024).cv:.2f}",
            [
                "collection",
                "steps",
                "first step starts s",
                "model s",
                "groups trained",
                "partial groups",
            ],
            rows,
        ),
        verdict("first train step ≤ 1/4 of baseline", frac <= 0.25, f"{frac:.2f} of baseline"),
        verdict(
            "no partial group ever trained",
            partial == 0,
            f"{partial} partial of {rows[0][4] + rows[1][4]}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 steps per mode")
    print("\n".join(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
