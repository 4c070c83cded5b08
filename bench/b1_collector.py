"""B1: collector throughput when the environment's latency dominates.

Candidate: the real `Collector` with C episodes in flight (C = N, 2N, 4N),
refilled the moment one ends. Baseline, same run, same seed, same tasks:
synchronous collection — launch N, wait for all N, repeat (the same collector
under `Admission` with max_staleness 0, as the pipeline's sync mode runs it).
Group size 1 (every episode its own task), engine calls answer after g.

Model: Little's law λ ≤ C / E[W]; the synchronous collector makes λ = N / E[max W]
over each batch of N. Targets: async/sync ≥ 3x on ``search``; λ ≥ 0.85 x C/E[W].

    .venv/bin/python -m bench.b1_collector --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from typing import Any

from bench._harness import DelayEngine, PlanStats, make_agent, plan_stats, ratio, table, verdict
from rl_core.envs.simulated import SimulatedLatency
from rl_core.host.telemetry import SpanRecorder
from rl_core.pipeline.collector import Collector
from rl_core.pipeline.queue import Admission, GroupQueue

MODEL_DELAY_S = 0.0  # environment latency dominates: the engine answers at once


@dataclasses.dataclass
class Measured:
    episodes: int
    seconds: float
    mean_w: float  # measured, of the episodes counted
    played_tasks: int

    @property
    def rate(self) -> float:
        return self.episodes / self.seconds


async def collect(
    env_cfg: dict[str, Any], *, n: int, c: int, sync: bool, window_s: float, warm_s: float
) -> Measured:
    recorder = SpanRecorder()
    engine = DelayEngine(MODEL_DELAY_S)
    # Async: the pipeline's own admission by episode (C in flight). No trainer versions it
    # here, so each group taken counts as one version (below), and a bound of C - 1
    # versions keeps at most C episodes started and not yet taken, as the old window of C
    # groups did: a collector that starts more than its consumer takes only queues them.
    admission = (
        Admission(batch_groups=n, max_staleness=0, version=0)
        if sync
        else Admission(batch_groups=1, max_staleness=2 * c - 1, version=0, episodes=c)
    )
    queue = GroupQueue(admission=admission, policy="drop", requeue=lambda task: None, maxsize=4 * c)
    collector = Collector(
        agent=make_agent(engine, recorder),
        env=SimulatedLatency(),
        admission=admission,
        queue=queue,
        group_size=1,
        concurrency=c,
        seed=0,
        env_config=env_cfg,
        episode_timeout_s=None,
    )
    runner = asyncio.create_task(collector.run())
    t0 = time.perf_counter()
    counted, durations, last_batch_end = 0, [], t0
    try:
        if sync:
            # Whole batches only: a synchronous collector's throughput is per barrier.
            while time.perf_counter() - t0 < window_s or counted == 0:
                batch = [await queue.take() for _ in range(n)]
                last_batch_end = time.perf_counter()
                counted += sum(len(g.kept) for g in batch)
                durations += [t.duration_s for g in batch for t in g.kept]
                engine.version = admission.version + 1
                admission.set_version(engine.version)
                collector.drain_finished()
            seconds = last_batch_end - t0
        else:
            end = t0 + warm_s + window_s
            while (now := time.perf_counter()) < end:
                try:
                    group = await asyncio.wait_for(queue.take(), end - now)
                except TimeoutError:
                    break
                engine.version = admission.consumed
                admission.set_version(engine.version)
                if time.perf_counter() - t0 >= warm_s:  # steady state only (Little's law)
                    counted += len(group.kept)
                    durations += [t.duration_s for t in group.kept]
                collector.drain_finished()
            seconds = window_s
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    mean_w = sum(durations) / len(durations) if durations else 0.0
    return Measured(counted, seconds, mean_w, collector.next_index)


def run(quick: bool) -> list[str]:
    presets = {
        "tool-light": {"preset": "tool-light", "reward": "fixed"},
        "search": {"preset": "search", "reward": "fixed"},  # time scale 1/30 is the preset's
    }
    n = 32 if quick else 64
    out, verdicts = [], []
    for name, env_cfg in presets.items():
        stats: PlanStats = plan_stats(env_cfg, MODEL_DELAY_S, tasks=4096)
        mean_w = stats.mean
        window = (3.0 if name == "tool-light" else 8.0) * (1 if quick else 3)
        sync = asyncio.run(collect(env_cfg, n=n, c=n, sync=True, window_s=window, warm_s=0))
        rows = []
        sync_pred = n / stats.mean_max(n)
        rows.append(
            ["sync (N, barrier)", n, sync.rate, sync_pred, 1.0, sync.mean_w, sync.rate / sync_pred]
        )
        best = 0.0
        for k in (1, 2, 4):
            c = k * n
            m = asyncio.run(
                collect(env_cfg, n=n, c=c, sync=False, window_s=window, warm_s=2 * mean_w)
            )
            little = c / mean_w
            r = ratio(m.rate, sync.rate)
            best = max(best, r)
            rows.append([f"async C={k}N", c, m.rate, little, r, m.mean_w, m.rate / little])
            verdicts.append(
                verdict(
                    f"{name} C={k}N λ ≥ 0.85 x Little",
                    m.rate >= 0.85 * little,
                    f"{m.rate / little:.2f} x C/E[W]",
                )
            )
        if name == "search":
            verdicts.append(verdict("search async/sync ≥ 3x", best >= 3.0, f"best {best:.2f}x"))
        out.append(
            table(
                f"B1 {name}: N={n}, g={MODEL_DELAY_S}s; model inputs E[W]={mean_w:.3f}s, "
                f"tail CV={stats.cv:.2f}, E[max W | N]={stats.mean_max(n):.3f}s "
                f"({stats.mean_max(n) / mean_w:.1f}x E[W]), model-call "
                f"share={stats.model_frac:.2f}",
                [
                    "collector",
                    "C",
                    "λ ep/s",
                    "model bound ep/s",
                    "vs sync",
                    "measured E[W] s",
                    "λ/bound",
                ],
                rows,
            )
        )
    out.append(
        "  model bound: sync N/E[max W]; async Little's C/E[W]. "
        "Measured E[W] above the plan's = latency the collector adds (event loop, tokenising)."
    )
    return out + verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N=32, short windows (about 1 minute)")
    args = parser.parse_args()
    print("\n".join(run(args.quick)))


if __name__ == "__main__":
    main()
