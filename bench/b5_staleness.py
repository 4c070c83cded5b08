"""B5: staleness accounting at max_staleness 0, 1 and 4.

Each bound runs the real pipeline in ``async`` mode with C = (M+1)·N in
flight and a trainer slower than collection (T = 0.15 s of sleep), so
admission control, not the environment, sets how far ahead the collector runs.
M = 0 is the baseline (the synchronous algorithm). Staleness of every consumed
group is recomputed here from the trained groups themselves (step - 1 - the
version that started them), independently of the pipeline's own histogram.

Model: mean staleness ≈ (C + Q) / N, with C (episodes in flight) and Q
(finished trajectories queued) averaged over the samples (every 10 ms) taken while
the trainer computes, and staleness over the steps after the first M+1 (steady state).
Targets: 100 % of consumed trajectories within the bound; mean within ±20 %
of the model (for M = 0 the model is 0 and so must the mean be).

    .venv/bin/python -m bench.b5_staleness --quick
"""

from __future__ import annotations

import argparse
import statistics

from bench._harness import PipeSpec, SleepTrainer, run_pipeline, table, verdict

G, B, T_S = 2, 4, 0.15
N = G * B


def run(quick: bool) -> list[str]:
    env = {"preset": "tool-light", "reward": "fixed"}
    rows, verdicts = [], []
    for m in (0, 1, 4):
        spec = PipeSpec(
            env=env,
            group_size=G,
            batch_groups=B,
            concurrency=(m + 1) * N,
            mode="async",
            max_staleness=m,
            steps=12 if quick else 50,
            cap_s=30 if quick else 120,
        )
        r = run_pipeline(spec, trainer=SleepTrainer(T_S))
        # Steady state: the first M+1 steps cannot be M stale yet (versions start at 0).
        st = [t.step - 1 - g.version for t in r.trained if t.step > m + 1 for g in t.groups]
        every = r.staleness()  # the bound holds from the first step on
        within = sum(1 for s in every if s <= m) / len(every)
        mean = statistics.fmean(st)
        # Work ahead of the trainer while it computes: what the next batches will be made of.
        busy = [(x, y) for x, y, state in r.load if state in ("training", "syncing_weights")]
        c = statistics.fmean(x for x, _ in busy)
        q = statistics.fmean(y for _, y in busy)
        model = (c + q) / N
        own_max = max(r.metric("staleness/max"))
        rows.append(
            [
                m,
                len(r.steps),
                len(every),
                within,
                mean,
                model,
                c,
                q,
                own_max,
                sum(r.metric("groups/dropped_stale")),
            ]
        )
        verdicts.append(
            verdict(
                f"M={m}: 100 % within bound",
                within == 1.0 and own_max <= m,
                f"{within:.1%}, pipeline's max {own_max:g}",
            )
        )
        close = abs(mean - model) <= 0.2 * model if model > 0 else mean == 0
        verdicts.append(
            verdict(f"M={m}: mean within ±20 % of (C+Q)/N", close, f"{mean:.2f} vs {model:.2f}")
        )
    return [
        table(
            f"B5 staleness, tool-light, N={N} (G={G} x B={B}), T={T_S}s, C=(M+1)·N; baseline M=0",
            [
                "M",
                "steps",
                "groups",
                "within",
                "mean",
                "(C+Q)/N",
                "C avg",
                "Q avg",
                "pipeline max",
                "stale drops",
            ],
            rows,
        ),
        *verdicts,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 steps per bound")
    print("\n".join(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
