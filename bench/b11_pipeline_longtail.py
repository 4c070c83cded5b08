"""B11: the project's own pipeline on a long-tail agentic workload, sync vs async.

The real `Pipeline` (admission, group queue, staleness gate, the JAX `Trainer` on
``builtin:tiny``) with the model's calls answered at once (`DelayEngine(0.0)`),
on ``sim_latency`` ``long-tail`` (steps lognormal m = 50 ms, sigma 1.0; turns
lognormal m = 12, sigma 1.0, at most 32; a group's members play one task, so
one plan); GRPO groups of 4, 4 groups a step (N = 16), max_staleness 3, C = 32 /
64 / 128 episodes in flight; and ``tool-light`` at C = 64. Candidate ``async``,
baseline ``sync`` (the same parts with the bound forced to 0), back to back.

Train rows are cut or padded to one length (``--train-length``, 256 tokens: a
long-tail episode is up to ~800 tokens of the builtin character tokenizer, and
16 x 1024 rows take ~2 s a step here, which would make every C trainer-bound).
Rows come as 16, or 32 when a step takes a group in two parts; both shapes are
compiled before timing.

Per configuration, over a steady window (the steps after the first fifth):
traj/s (episodes trained), steps/s, E[W] and p95 W (measured episodes), E[W_env]
(the environment's own sleep, from the plan), L (episodes running, sampled every
20 ms), the bounds C/E[W], C/E[W_env], N/T_step (T_step: the trainer's busy
seconds per step) and traj/s over min(C/E[W], N/T_step); the trainer's blocked
share; this process's CPU (all threads) and the event loop's per finished
episode and per environment call; and, over the whole run, finished episodes
never trained on, by reason (stale metrics of docs/lifecycle.md), those left
queued or waiting for a straggler when the run stopped, and those cancelled.

A diagnostic row runs async at C = 64 with max_staleness 7: twice the room
admission gives episodes started and not yet trained on, (M + 1) x N.

Targets (max_staleness 3): async ≥ 0.9 x min(C/E[W], N/T_step) at C = 64, and
≥ 2x Tunix's async figure (docs/benchmarks.md); ≤ 1 % of finished episodes never
trained on. ``--out DIR`` gets the episodes-in-flight series of
sync and async at C = 64 (CSV) and a plot of them (SVG).

    .venv/bin/python -m bench.b11_pipeline_longtail --quick
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import itertools
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._harness import PipeRun, PipeSpec, p, run_pipeline, table, verdict
from bench._plot import svg_plot
from rl_core.envs.simulated import SimConfig, plan_episode
from rl_core.pipeline.batch import build_batch
from rl_core.pipeline.collector import derive_seed
from rl_core.pipeline.pipeline import Pipeline
from rl_core.pipeline.queue import Group
from rl_core.pretrained.sources import load_model
from rl_core.spec import ModelSpec
from rl_core.training.trainer import TrainBatch, Trainer, TrainerConfig

G, B, M = 4, 4, 3
N = G * B
SEED = 0
SAMPLE_S = 0.02
# turns_sigma spelled out: the code before the long-tail preset (b11's "before" run) reads it
# from the config, the preset's own is the same 1.0.
WORKLOADS: dict[str, dict[str, Any]] = {
    "long-tail": {"preset": "long-tail", "turns_sigma": 1.0},
    "tool-light": {"preset": "tool-light"},
}
TUNIX = {"sync": 4.13, "async": 15.4}  # traj/s, docs/benchmarks.md (same workload, C = 64)


# --- the trainer ----------------------------------------------------------------


def make_trainer(length: int) -> tuple[Trainer, Any, float]:
    """The real trainer; every batch cut or padded to ``length``, both row counts compiled."""
    model, tok = load_model(ModelSpec(source="builtin:tiny"), seed=SEED)
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-4))

    def fixed(batch: TrainBatch) -> TrainBatch:
        def fit(a: np.ndarray) -> np.ndarray:
            a = a[:, :length]
            return np.pad(a, ((0, 0), (0, length - a.shape[1])))

        fields = ("tokens", "loss_mask", "logprobs")
        extra = {f: fit(getattr(batch, f)) for f in fields}
        if batch.advantages.ndim == 2:
            extra["advantages"] = fit(batch.advantages)
        return dataclasses.replace(batch, **extra)

    def make_batch(groups: list[Group]) -> TrainBatch:
        return fixed(
            build_batch(groups, group_size=G, rows=N, pad_id=tok.pad_id, scale_rewards=True)
        )

    step_s = 0.0
    for rows in (2 * N, N):
        warm = TrainBatch.pack(
            [[1] * 64] * rows, [[1] * 64] * rows, [[-1.0] * 64] * rows, [0.1] * rows, rows=rows
        )
        trainer.train_step(fixed(warm))  # compile
        t0 = time.perf_counter()
        trainer.train_step(fixed(warm))
        step_s = time.perf_counter() - t0
    return trainer, make_batch, step_s


# --- one run --------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    t: float  # wall clock (time.time), the spans' axis
    inflight: int  # collector.inflight: started, including any waiting for a slot
    running: int  # of those, past the semaphore (L)
    cpu: float  # process CPU seconds, all threads
    loop_cpu: float  # the event loop thread's CPU seconds


@dataclasses.dataclass
class Run:
    workload: str
    mode: str
    c: int
    pipe: PipeRun
    samples: list[Sample]
    step_at: list[float]  # wall clock of each train step's batch
    trained_ids: list[set[str]]  # per step: episodes with a call trained on
    trained_calls: int  # the model calls of those episodes (masked or not)
    left_ids: set[str]  # finished, not trained, their group still pending at the end
    cancelled: int
    m: int = M

    @property
    def label(self) -> str:
        return self.mode if self.m == M else f"{self.mode} M={self.m}"


def trained_members(group: Group) -> list[Any]:
    trainable = getattr(group, "trainable", None)  # the code before admission by episode: kept
    return trainable(group.fresh_from) if trainable else group.kept


def measure(
    workload: str,
    mode: str,
    c: int,
    *,
    trainer: Any,
    make_batch: Any,
    steps: int,
    cap_s: float,
    m: int = M,
) -> Run:
    samples: list[Sample] = []
    step_at: list[float] = []
    trained: list[set[str]] = []
    calls = [0]
    pipes: list[Pipeline] = []

    async def sample(pipe: Pipeline) -> None:
        while True:
            live = list(pipe.collector.inflight.values())
            running = sum(t.stage not in ("queued", "finished") for t in live)
            samples.append(
                Sample(time.time(), len(live), running, time.process_time(), time.thread_time())
            )
            await asyncio.sleep(SAMPLE_S)

    class Sampled(Pipeline):
        async def run(self) -> Any:
            pipes.append(self)
            sampler = asyncio.create_task(sample(self))
            try:
                return await super().run()
            finally:
                sampler.cancel()

    def batch(groups: list[Group]) -> Any:
        step_at.append(time.time())
        members = [t for g in groups for t in trained_members(g)]
        trained.append({t.episode_id for t in members})
        calls[0] += sum(t.turns for t in members)
        return make_batch(groups)

    spec = PipeSpec(
        env=WORKLOADS[workload],
        group_size=G,
        batch_groups=B,
        concurrency=c,
        mode=mode,
        max_staleness=m,
        steps=steps,
        cap_s=cap_s,
        max_turns=32,
        max_context=2048,
    )
    run = run_pipeline(spec, trainer=trainer, make_batch=batch, pipeline_cls=Sampled)
    pipe = pipes[0]
    done = {t for s in trained for t in s}
    pending = {index for index, _ in pipe.collector.position()["pending"]}
    left = {
        e
        for e in _finished(run)
        if e not in done and _group_index(e) in pending  # waiting in the queue or for a straggler
    }
    cancelled = len(pipe.collector.cancelled)
    return Run(workload, mode, c, run, samples, step_at, trained, calls[0], left, cancelled, m)


def _group_index(episode_id: str) -> int:
    match = re.search(r"g(\d+)-e\d+", episode_id)
    assert match, episode_id
    return int(match.group(1))


def _finished(run: PipeRun) -> dict[str, Any]:
    """Episode id -> its rollout span, for every episode that ended on its own."""
    out = {}
    for s in run.spans:
        if s.name == "rollout" and (s.args or {}).get("end_state") != "cancelled":
            out[s.track.removeprefix("episode/")] = s
    return out


# --- figures --------------------------------------------------------------------


@dataclasses.dataclass
class Figures:
    traj_s: float
    steps_s: float
    w: float
    w_p95: float
    w_env: float  # the plan's environment time of the same episodes
    w_env_measured: float  # their env_step spans, summed
    l_mean: float
    t_step: float
    blocked: float
    cpu_ep_ms: float
    cpu_call_ms: float
    loop_call_ms: float
    loop_busy: float  # the event loop thread's CPU over the window's wall time
    lag_ms: float
    queued: float  # trajectories waiting for the trainer, mean of the harness's samples
    staleness: float
    finished: int
    never_trained: int
    stale_untrained: int
    dropped_stale_groups: int
    dropped_failed_groups: int
    requeued_groups: int
    calls_masked: int
    split_groups: int
    left: int
    cancelled: int
    steps_32_rows: int

    def bound(self, c: int) -> float:
        return min(c / self.w, N / self.t_step)


def figures(run: Run) -> Figures:
    n = len(run.step_at)
    k = max(1, n // 5)
    t0, t1 = run.step_at[k], run.step_at[-1]
    span = t1 - t0
    window = range(k, n)
    metrics = [run.pipe.steps[i] for i in window if i < len(run.pipe.steps)]
    trained = sum(len(run.trained_ids[i]) for i in range(k + 1, n))
    cfg = SimConfig(**WORKLOADS[run.workload])
    plans: dict[int, float] = {}

    def plan_s(episode: str) -> float:
        i = _group_index(episode)
        if i not in plans:
            plans[i] = sum(plan_episode(cfg, derive_seed(SEED, "env", i)).latencies_s)
        return plans[i]

    finished = _finished(run.pipe)
    ended = {
        e: s.dur_us / 1e6 for e, s in finished.items() if t0 <= (s.start_us + s.dur_us) / 1e6 <= t1
    }
    env_spans = [s for s in run.pipe.spans if s.name == "env_step"]
    env_s: dict[str, float] = {}
    for s in env_spans:
        e = s.track.removeprefix("episode/")
        env_s[e] = env_s.get(e, 0.0) + s.dur_us / 1e6
    calls = sum(t0 <= (s.start_us + s.dur_us) / 1e6 <= t1 for s in env_spans)
    inside = [s for s in run.samples if t0 <= s.t <= t1]
    cpu = inside[-1].cpu - inside[0].cpu
    loop_cpu = inside[-1].loop_cpu - inside[0].loop_cpu
    wall = sum(m["step_time_s"] for m in metrics)
    done = set().union(*run.trained_ids)

    def total(name: str) -> int:
        return int(sum(m.get(name, 0.0) for m in run.pipe.steps))

    w = list(ended.values())
    return Figures(
        traj_s=trained / span,
        steps_s=(n - 1 - k) / span,
        w=statistics.fmean(w),
        w_p95=p(w, 95),
        w_env=statistics.fmean(plan_s(e) for e in ended),
        w_env_measured=statistics.fmean(env_s.get(e, 0.0) for e in ended),
        l_mean=time_mean([(s.t, s.running) for s in inside]),
        t_step=sum(m["trainer/busy_frac"] * m["step_time_s"] for m in metrics) / len(metrics),
        blocked=sum(m["trainer/blocked_frac"] * m["step_time_s"] for m in metrics) / wall,
        cpu_ep_ms=1e3 * cpu / len(ended),
        cpu_call_ms=1e3 * cpu / calls,
        loop_call_ms=1e3 * loop_cpu / calls,
        loop_busy=loop_cpu / span,
        lag_ms=statistics.fmean(m["loop/lag_ms_mean"] for m in metrics),
        queued=statistics.fmean(q for _, q, _ in run.pipe.load[len(run.pipe.load) // 5 :]),
        staleness=statistics.fmean(m["staleness/mean"] for m in metrics),
        finished=len(finished),
        never_trained=len(set(finished) - done - run.left_ids),
        stale_untrained=total("stale/episodes_untrained"),
        dropped_stale_groups=total("groups/dropped_stale"),
        dropped_failed_groups=total("groups/dropped_failed"),
        requeued_groups=total("groups/requeued"),
        calls_masked=total("stale/calls_masked"),
        split_groups=total("groups/split"),
        left=len(run.left_ids),
        cancelled=run.cancelled,
        steps_32_rows=sum(len(s) > N for s in run.trained_ids),
    )


def time_mean(points: Sequence[tuple[float, float]]) -> float:
    """The mean over time of a series sampled at uneven moments (a late loop samples late)."""
    pairs = list(itertools.pairwise(points))
    return sum(y * (t2 - t1) for (t1, y), (t2, _) in pairs) / (points[-1][0] - points[0][0])


# --- the plot -------------------------------------------------------------------


def write_series(runs: Sequence[Run], out: Path, c: int) -> list[Path]:
    """CSV of episodes in flight over time, and an SVG of ``running`` per mode."""
    paths: list[Path] = []
    lines: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        start = run.samples[0].t
        path = out / f"b11_inflight_{run.workload}_C{c}_{run.mode}.csv"
        rows = ["t_s,inflight,running"]
        rows += [f"{s.t - start:.3f},{s.inflight},{s.running}" for s in run.samples]
        path.write_text("\n".join(rows) + "\n")
        paths.append(path)
        lines[run.mode] = [(s.t - start, s.running) for s in run.samples]
    svg = out / f"b11_inflight_C{c}.svg"
    svg.write_text(svg_plot(lines, c, f"long-tail, C = {c}: episodes running (L) over time"))
    return [*paths, svg]


# --- the report -----------------------------------------------------------------


def report(runs: list[tuple[Run, Figures]]) -> list[str]:
    rows, loss_rows, out = [], [], []
    by_key = {}
    for run, f in runs:
        by_key[run.workload, run.label, run.c] = (run, f)
        bound = f.bound(run.c)
        rows.append(
            [
                run.workload,
                run.label,
                run.c,
                len(run.step_at),
                f.traj_s,
                f.steps_s,
                f.w,
                f.w_p95,
                f.w / f.w_env,
                f.l_mean,
                f.l_mean / run.c,
                run.c / f.w,
                run.c / f.w_env,
                N / f.t_step,
                f.traj_s / bound,
                f.blocked,
                f.cpu_ep_ms,
                f.cpu_call_ms,
                f.loop_call_ms,
                f.loop_busy,
            ]
        )
        never = f.never_trained
        loss_rows.append(
            [
                run.workload,
                run.label,
                run.c,
                f.finished,
                never,
                never / f.finished,
                f.stale_untrained,
                f.dropped_stale_groups,
                f.dropped_failed_groups,
                f.requeued_groups,
                f.calls_masked,
                f.calls_masked / max(run.trained_calls, 1),
                f.split_groups,
                f.steps_32_rows,
                f.left,
                f.cancelled,
            ]
        )
    out.append(
        table(
            f"B11: N = {N} ({B} groups of {G}), max_staleness {M}; steady window = the steps "
            "after the first fifth",
            [
                "workload",
                "mode",
                "C",
                "steps",
                "traj/s",
                "steps/s",
                "E[W] s",
                "p95 W",
                "W/W_env",
                "L",
                "L/C",
                "C/E[W]",
                "C/E[Wenv]",
                "N/T",
                "of bound",
                "blocked",
                "CPU ms/ep",
                "CPU ms/call",
                "loop ms/call",
                "loop busy",
            ],
            rows,
        )
    )
    out.append(
        table(
            "Episodes started and never trained on (whole run): finished, never trained (their "
            "share), by reason",
            [
                "workload",
                "mode",
                "C",
                "finished",
                "never",
                "share",
                "stale untrained",
                "groups dropped stale",
                "failed",
                "requeued",
                "calls masked",
                "of calls",
                "groups split",
                "32-row steps",
                "left at end",
                "cancelled",
            ],
            loss_rows,
        )
    )
    model = []
    for (workload, mode, c), (run, f) in by_key.items():
        room = (run.m + 1) * N if run.mode == "async" else N
        model.append(
            f"  {workload} {mode} C={c}: T_step {f.t_step:.3f} s, E[W_env] {f.w_env:.3f} s "
            f"(env_step "
            f"spans {f.w_env_measured:.3f} s), loop lag {f.lag_ms:.1f} ms, queued Q "
            f"{f.queued:.1f}, staleness {f.staleness:.2f}, "
            f"Little's L/E[W] = {f.l_mean / f.w:.1f} ep/s, L + Q = {f.l_mean + f.queued:.1f} "
            f"of the {room} admission allows"
        )
    out += ["Model inputs:", *model]
    verdicts = []
    hit = by_key.get(("long-tail", "async", 64))
    if hit:
        run, f = hit
        frac = f.traj_s / f.bound(64)
        verdicts.append(
            verdict(
                "long-tail async C=64 ≥ 0.9 x min(C/E[W], N/T_step)",
                frac >= 0.9,
                f"{frac:.2f} ({f.traj_s:.1f} traj/s of {f.bound(64):.1f})",
            )
        )
        verdicts.append(
            verdict(
                "long-tail async C=64 ≥ 2x Tunix's async (docs/benchmarks.md)",
                f.traj_s >= 2 * TUNIX["async"],
                f"{f.traj_s / TUNIX['async']:.2f}x",
            )
        )
        sync = by_key.get(("long-tail", "sync", 64))
        if sync:
            out.append(
                f"  long-tail C=64: async/sync traj/s = {f.traj_s / sync[1].traj_s:.2f}x; "
                f"Tunix 0.1.7 (docs/benchmarks.md): sync {TUNIX['sync']}, async {TUNIX['async']} "
                f"traj/s (async here {f.traj_s / TUNIX['async']:.2f}x Tunix's)"
            )
    for (workload, mode, c), (_, f) in by_key.items():
        if mode == "async":
            share = f.never_trained / f.finished
            verdicts.append(
                verdict(
                    f"{workload} async C={c}: finished never trained ≤ 1 %",
                    share <= 0.01,
                    f"{share:.2%} ({f.never_trained} of {f.finished})",
                )
            )
    return out + verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="short windows, sync at C = 64 only (~3 minutes)"
    )
    parser.add_argument("--out", type=Path, help="folder for the CSV and SVG (default: a temp dir)")
    parser.add_argument("--train-length", type=int, default=256, help="train row length")
    parser.add_argument("--concurrency", default="32,64,128", help="C values for long-tail")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="b11-"))
    out.mkdir(parents=True, exist_ok=True)
    trainer, make_batch, step_s = make_trainer(args.train_length)
    print(f"trainer: builtin:tiny, {N} x {args.train_length} rows, warm step {step_s:.3f} s")
    quick = args.quick
    async_s, sync_steps = (15.0, 6) if quick else (40.0, 12)
    plan = []
    for c in map(int, args.concurrency.split(",")):
        if c == 64 or not quick:  # sync admits N episodes per policy: C >= N changes nothing
            plan.append(("long-tail", c, "sync", M))
        plan.append(("long-tail", c, "async", M))
        if c == 64:  # a diagnostic: the same with twice the staleness room
            plan.append(("long-tail", c, "async", 2 * M + 1))
    plan += [("tool-light", 64, "sync", M), ("tool-light", 64, "async", M)]
    runs: list[tuple[Run, Figures]] = []
    for workload, c, mode, m in plan:
        light = workload == "tool-light"
        steps = 10_000 if mode == "async" else (3 if light else 1) * sync_steps
        cap = (async_s / 2 if light else async_s) if mode == "async" else 120.0
        started = time.perf_counter()
        run = measure(
            workload, mode, c, trainer=trainer, make_batch=make_batch, steps=steps, cap_s=cap, m=m
        )
        runs.append((run, figures(run)))
        # Keep the figures only: the spans and groups of a run (~10^5 objects) would otherwise
        # sit in every full pass of the garbage collector during the later runs.
        run.pipe.spans.clear()
        run.pipe.trained.clear()
        gc.collect()
        print(
            f"  ran {workload} {run.label} C={c}: {len(run.step_at)} steps in "
            f"{time.perf_counter() - started:.0f} s",
            flush=True,
        )
    lines = report(runs)
    at64 = [r for r, _ in runs if r.workload == "long-tail" and r.c == 64 and r.m == M]
    if len(at64) == 2:
        lines += [f"  wrote {path}" for path in write_series(at64, out, 64)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
