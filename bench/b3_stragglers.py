"""B3: straggler tolerance on ``adversarial-tail`` (search, log-sd 1.5 per step, 1 % timeouts).

Candidate: ``async`` mode, C = 4N in flight, max_staleness 3: a step trains on
the first N to finish. Baseline, same run, same seed: ``sync`` mode, whose step
waits for the slowest of its N (E[max W | N]). Trainer: T seconds of sleep.
Time scale 1/60 (scaled step median 25 ms, above the loop's timer error).

Target: async step-time p95/p50 ≤ 2 (the sync figure is printed beside it).

    .venv/bin/python -m bench.b3_stragglers --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench._harness import PipeSpec, SleepTrainer, p, plan_stats, run_pipeline, table, verdict

T_S = 0.2
N = 16


def run(quick: bool) -> list[str]:
    env = {"preset": "adversarial-tail", "base": "search", "time_scale": 1 / 60, "reward": "fixed"}
    base = PipeSpec(
        env=env, group_size=1, batch_groups=N, concurrency=N, cap_s=45 if quick else 180
    )
    sync = dataclasses.replace(base, mode="sync", steps=8 if quick else 30)
    cand = dataclasses.replace(
        base, mode="async", max_staleness=3, concurrency=4 * N, steps=24 if quick else 90
    )
    runs = {
        "sync": run_pipeline(sync, trainer=SleepTrainer(T_S)),
        "async C=4N": run_pipeline(cand, trainer=SleepTrainer(T_S)),
    }
    stats = plan_stats(env, 0.0, tasks=2048)
    rows, tails = [], {}
    for name, r in runs.items():
        st = r.metric("step_time_s")[1:]
        p50, p95 = p(st, 0.5), p(st, 0.95)
        tails[name] = p95 / p50
        failed = sum(r.metric("failures/total"))
        rows.append(
            [
                name,
                len(r.steps),
                statistics.fmean(st),
                p50,
                p95,
                p95 / p50,
                failed,
                sum(r.metric("groups/dropped_stale")),
            ]
        )
    a = tails["async C=4N"]
    return [
        table(
            "B3 adversarial-tail (search, sigma=1.5, 1 % timeouts, scale 1/60), "
            f"N={N}, T={T_S}s; model inputs "
            f"E[W]={stats.mean:.3f}s, tail CV={stats.cv:.2f}, "
            f"E[max W | N]={stats.mean_max(N):.3f}s "
            f"({stats.mean_max(N) / stats.mean:.1f}x E[W]), model-call share=0",
            [
                "mode",
                "steps",
                "mean step s",
                "p50 s",
                "p95 s",
                "p95/p50",
                "failed eps",
                "stale drops",
            ],
            rows,
        ),
        f"  model: sync step ≈ E[max W|N]+T = {stats.mean_max(N) + T_S:.3f}s; async step ≈ "
        "max(T, N·E[W]/C) = "
        f"{max(T_S, N * stats.mean / (4 * N)):.3f}s",
        verdict("async step p95/p50 ≤ 2", a <= 2.0, f"{a:.2f} (sync {tails['sync']:.2f})"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="8 sync + 24 async steps (under a minute)"
    )
    print("\n".join(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
