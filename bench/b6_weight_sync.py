"""B6: the weight-sync stall on ``swe``, weights synced every step.

Candidate: the pipeline's sync by version (``async`` mode): after each train
step the new weights go to the engine at once; episodes in flight carry on
(their trajectories keep the version that started them). Baseline, same run,
same seed: drain-then-sync — after the train step, admit nothing new, wait
until every in-flight episode has ended, then swap the weights (a
`DrainingPipeline` below; the pipeline has no such mode, so the baseline is
built here on its step loop). A weight copy costs S0 = 20 ms (the snapshot
sleeps), standing in for a device-to-engine transfer. Trainer: T = 0.1 s.

Exposed sync: seconds the trainer's step loop is held by the sync (the
``weight_sync`` span; for the baseline plus the drain), as a share of step time.
Target: candidate ≤ 5 %.

    .venv/bin/python -m bench.b6_weight_sync --quick
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from typing import Any

from bench._harness import PipeSpec, SleepTrainer, plan_stats, ratio, run_pipeline, table, verdict
from rl_core.pipeline.pipeline import Pipeline
from rl_core.pipeline.queue import Group

S0_S, T_S, N = 0.02, 0.1, 4


def slow_snapshot(params: Any) -> Any:
    time.sleep(S0_S)
    return params


class DrainingPipeline(Pipeline):
    """The baseline: stop admitting, drain in-flight episodes, then sync (overrides `_train`)."""

    async def _train(self, step: int, groups: list[Group]) -> tuple[dict[str, float], float, float]:
        submitted = time.perf_counter()

        def train() -> dict[str, float]:
            with self.recorder.span("train_step", track="trainer", step=step):
                return self.trainer.train_step(self.build_batch(groups))

        metrics = await self.device.run_trainer(train)
        bound = self.admission.max_staleness
        self.admission.max_staleness = -(10**9)  # capacity < 0: nothing new starts
        # The collector signals no "all ended" event; polling at 5 ms is the baseline's own cost.
        while self.collector.inflight:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        self.admission.max_staleness = bound

        def sync() -> None:
            with self.recorder.span("weight_sync", track="trainer", step=step):
                self.engine.update_weights(self.snapshot(self.trainer.params()), version=step)

        await self.device.run_trainer(sync)
        self.admission.set_version(self.admission.version)  # wake the collector
        end = time.perf_counter()
        return metrics, end - submitted, 0.0


def run(quick: bool) -> list[str]:
    env = {"preset": "swe", "time_scale": 1 / 30, "reward": "fixed"}
    spec = PipeSpec(
        env=env,
        group_size=1,
        batch_groups=N,
        concurrency=2 * N,
        mode="async",
        max_staleness=1,
        cap_s=40 if quick else 160,
    )
    runs = {
        "sync by version": run_pipeline(
            dataclasses.replace(spec, steps=8 if quick else 30),
            trainer=SleepTrainer(T_S),
            snapshot=slow_snapshot,
        ),
        "drain then sync": run_pipeline(
            dataclasses.replace(spec, steps=4 if quick else 15),
            trainer=SleepTrainer(T_S),
            snapshot=slow_snapshot,
            pipeline_cls=DrainingPipeline,
        ),
    }
    stats = plan_stats(env, 0.0, tasks=512)
    rows, shares = [], []
    for name, r in runs.items():
        steps = r.metric("step_time_s")[1:]
        sync_s = statistics.fmean(r.metric("time/weight_sync_s")[1:])
        exposed = sync_s
        if name == "drain then sync":
            # The drain: seconds the step loop neither trains nor collects the next batch.
            exposed += statistics.fmean(r.metric("step_time_s")[1:]) - statistics.fmean(
                [
                    a + b + c
                    for a, b, c in zip(
                        r.metric("time/queue_wait_s")[1:],
                        r.metric("time/train_step_s")[1:],
                        r.metric("time/weight_sync_s")[1:],
                        strict=True,
                    )
                ]
            )
        share = exposed / statistics.fmean(steps)
        shares.append(share)
        rows.append(
            [
                name,
                len(r.steps),
                statistics.fmean(steps),
                sync_s,
                exposed,
                share,
                len(r.steps) / r.wall_s,
            ]
        )
    return [
        table(
            f"B6 weight sync every step, swe (scale 1/30), N={N}, C={2 * N}, "
            f"T={T_S}s, S0={S0_S}s; model inputs "
            f"E[W]={stats.mean:.2f}s, tail CV={stats.cv:.2f}, "
            f"E[max W | C]={stats.mean_max(2 * N):.2f}s",
            ["sync", "steps", "step s", "S (span) s", "exposed s", "exposed share", "steps/s"],
            rows,
        ),
        f"  ratio of exposed shares baseline/candidate = {ratio(shares[1], shares[0]):.1f}x",
        verdict(
            "exposed sync ≤ 5 % of step time",
            shares[0] <= 0.05,
            f"{shares[0]:.1%} (drain-then-sync {shares[1]:.1%})",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 + 4 steps")
    print("\n".join(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
