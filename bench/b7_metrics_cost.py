"""B7: the cost of always-on stage metrics.

Candidate: the pipeline as it always runs (every span recorded: rollout,
model_call, env_step, reward, queue_wait, train_step, weight_sync). Baseline,
same run, same seed: the same pipeline with spans off (`NullRecorder`; the
pipeline has no switch, so the baseline swaps the recorder). Workload chosen
to make per-event overhead visible: ``tool-light``, engine calls of 5 ms, a
20 ms trainer, so spans are recorded at a high rate. The two alternate
(on, off, on, off, ...) and the medians are compared, since this machine is
shared and noisy.

Also: for every step of the candidate, the trainer's spans (queue_wait +
train_step + weight_sync) over the step's wall time.
Targets: ≤ 3 % throughput loss; spans cover ≥ 95 % of every step.

    .venv/bin/python -m bench.b7_metrics_cost --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import defaultdict

from bench._harness import PipeRun, PipeSpec, SleepTrainer, run_pipeline, table, verdict

G, B = 4, 4
TRAINER_STAGES = ("queue_wait", "train_step", "weight_sync")


def throughput(r: PipeRun) -> float:
    """Trajectories trained per second over the steady steps (the first includes the start)."""
    steps = r.metric("step_time_s")[1:]
    return G * B * len(steps) / sum(steps)


def coverage(r: PipeRun) -> list[float]:
    covered: dict[int, float] = defaultdict(float)
    for s in r.spans:
        if s.track == "trainer" and s.name in TRAINER_STAGES:
            covered[s.step] += s.dur_us / 1e6
    return [covered[i + 1] / m["step_time_s"] for i, m in enumerate(r.steps)]


def run(quick: bool) -> list[str]:
    env = {"preset": "tool-light", "reward": "fixed"}
    spec = PipeSpec(
        env=env,
        group_size=G,
        batch_groups=B,
        concurrency=2 * G * B,
        mode="async",
        max_staleness=1,
        steps=15 if quick else 60,
        cap_s=30 if quick else 120,
        model_delay_s=0.005,
    )
    pairs = 6 if quick else 12
    on, off, cover = [], [], []
    spans = 0
    for _ in range(pairs):
        r_on = run_pipeline(spec, trainer=SleepTrainer(0.02))
        r_off = run_pipeline(dataclasses.replace(spec, metrics=False), trainer=SleepTrainer(0.02))
        on.append(throughput(r_on))
        off.append(throughput(r_off))
        cover += coverage(r_on)
        spans += len(r_on.spans)
    m_on, m_off = statistics.median(on), statistics.median(off)
    loss = 1 - m_on / m_off
    rows = [
        ["metrics on", pairs, m_on, min(on), max(on)],
        ["metrics off", pairs, m_off, min(off), max(off)],
    ]
    return [
        table(
            f"B7 stage metrics on vs off, tool-light, N={G * B}, C={2 * G * B}, g=5 ms, T=20 ms; "
            f"{spans / pairs:.0f} spans per candidate run",
            ["mode", "runs", "median traj/s", "min", "max"],
            rows,
        ),
        f"  throughput loss = {loss:+.1%} (on/off = {m_on / m_off:.3f}); step coverage by "
        "trainer spans: "
        f"min {min(cover):.1%}, median {statistics.median(cover):.1%}, "
        f"{sum(c >= 0.95 for c in cover)} of {len(cover)} steps ≥ 95 % (the rest: the event "
        "loop late "
        "to resume the trainer after the device call, see loop/lag_ms)",
        verdict("≤ 3 % throughput loss", loss <= 0.03, f"{loss:+.1%}"),
        verdict("spans cover ≥ 95 % of each step", min(cover) >= 0.95, f"min {min(cover):.1%}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 on/off pairs of 15 steps")
    print("\n".join(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
