"""B12: the long-tail workload through the whole stack, sync vs async, in one invocation.

    .venv/bin/python bench/b12_stack_longtail.py [--quick] [--steps 60] [--concurrency 64]
        [--repeats 1] [--max-staleness 3] [--modes sync,async] [--out bench/figures]
        [--dump DIR]

A deployment on loopback, started as an operator would (``bench/_deployment.py``:
PostgreSQL and Redis, ``rlaas migrate``, ``rlaas tenants create``, the API,
one Celery worker, each its own process), and beside it, in a process of its
own, the environment server of ``bench/_longtail_env.py``: the SDK's
`EnvServer` over docs/benchmarks.md's long-tail workload (steps lognormal m =
50 ms, sigma 1.0; turns m = 12, sigma 1.0, at most 32), timing itself.

The environment is registered and every run submitted through the public
API: ``builtin:tiny``, GRPO groups of 4, 4 groups a step (N = 16), C episodes
in flight (``rollout.concurrency``, 64), max_staleness 3, everything else as
examples/tiny-game.yaml sets it (what a user who brings this environment to
the example runs: two epochs of two mini-batches a step); ``sync`` (the
baseline) then ``async``, back to back, same seed. Model calls are the real
JAX engine's, in the worker, sharing its device thread with the trainer.
Variants (`make_spec`): ``async-lean`` B12's leaner settings until
2026-12-07, ``async-reuse`` the engine's prefix pool on, ``async-nofit``
the trainer without its shape ledger.

The random-init model first has to learn to end its turns (an unended turn
truncates the episode; bench/_longtail_env.py): until then episodes last a
turn or two. The warm-up ends with the last step in which over a fifth of
the episodes that ended were truncated; the window in which a run is
measured opens after it and the first fifth of the steps that follow it, and
closes at the last step, by the ``train_step`` spans of the run's timeline.
In it, by the environment server's own clock: E[W] and p95 W (reset arrival
to the answer of the step that said done), E[W_env] (its own sleeps), L
(episodes open, sampled every 50 ms, time-averaged) and L/C, env calls/s;
from the run's metrics (API):
traj/s (``episode/trained``), steps/s, T_step (``time/train_step_s`` +
``time/weight_sync_s``), the trainer's blocked share and the engine's busy
share; the bounds C/E[W], C/E[W_env], N/T_step; the webhook path's time per
call (the worker's ``time/env_step_s`` less the server's sleeps); the
worker's CPU (psutil, its process tree) per environment call the server
answered (resets, steps, closes), over the window and the whole run (model
calls and training included: the worker does all three). Over the whole run:
episodes started and never trained on, by the reasons the run's metrics give
(rl_core/pipeline/metrics.py). Targets (docs/benchmarks.md), async: L ≥ 0.9
C; E[W] ≤ 1.3 E[W_env]; traj/s ≥ 0.4 C/E[W_env]. ``--out`` gets
``b12_inflight.svg``: episodes open over time, both modes, the first C and
seed; ``--dump`` each run's raw data as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._deployment import Deployment, deployment
from bench._longtail_env import SAMPLE_S
from bench._plot import svg_plot
from bench.b8_stack import REPO, free_port, percentile, table
from sdk.client import Client

G, B = 4, 4
N = G * B
# The failure reasons of rl_core/pipeline/metrics.py that are not the run stopping.
FAILURES = ("episode_timeout", "env_timeout", "env_reset", "env_step")


# --- one run ----------------------------------------------------------------------


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of a process and its children alive now."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


class CpuSampler:
    """The worker's CPU every 0.25 s, so that a window inside the run can be read."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self.points.append((time.time(), tree_cpu(self.proc)))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.points.append((time.time(), tree_cpu(self.proc)))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            self.points.append((time.time(), tree_cpu(self.proc)))


@dataclasses.dataclass
class Run:
    mode: str
    c: int
    seed: int
    run_id: str
    wall_s: float
    metrics: dict[int, dict[str, float]]  # step -> name -> value
    train_spans: list[tuple[float, float]]  # (start, end) in seconds, time.time's clock
    episodes: list[dict[str, Any]]  # the env server's records
    calls: int  # env calls the server answered for this run
    samples: list[tuple[float, int, int, float]]  # the server's (t, open, calls, slept)
    cpu: list[tuple[float, float]]  # the worker's (t, CPU seconds)


def make_spec(env_id: str, mode: str, c: int, steps: int, m: int, seed: int) -> dict[str, Any]:
    """The spec of one run: ``mode`` is the staleness mode, then variants after dashes.

    B12 runs the workload on examples/tiny-game.yaml's settings (`example_spec`), as a user
    who swaps the example's game for their own does (issue #35, item 5: B12's leaner
    settings had given 1.3-1.8x the trajectories/s the same workload got on the example's).
    Variants: "lean", B12's settings until 2026-12-07 (`lean_spec`: one update a step);
    "reuse", the engine's prefix pool on (`rollout.prefix_reuse`); "nofit",
    `train.fit_compiled` off (every new step shape compiled: the trainer before its ledger).
    """
    staleness_mode, *variants = mode.split("-")
    if "user" in variants:
        raise SystemExit(f"--modes {mode}: B12 runs the example's settings now (plain "
                         f"{staleness_mode}); {staleness_mode}-lean is the old B12")  # fmt: skip
    unknown = set(variants) - {"lean", "reuse", "nofit"}
    if staleness_mode not in ("sync", "async") or unknown:
        raise SystemExit(f"--modes: unknown mode {mode!r}")
    make = lean_spec if "lean" in variants else example_spec
    spec = make(env_id, staleness_mode, c, steps, m, seed)
    spec["name"] = f"b12-{mode}-C{c}-seed{seed}"
    if "reuse" in variants:
        spec["rollout"]["prefix_reuse"] = True
    if "nofit" in variants:
        spec["train"]["fit_compiled"] = False
    return spec


# The workload's agent: 32 turns of "ok?" and an 8-token reply fit in ~450 tokens, never
# cut by context. 8 tokens: the random model ends a turn within them about one time in six,
# enough for GRPO to learn to end its turns in 9-16 steps (bench/_longtail_env.py).
AGENT = {"max_turns": 32, "max_new_tokens": 8, "max_context": 512, "tool_call_format": "none"}


def lean_spec(
    env_id: str, staleness_mode: str, c: int, steps: int, m: int, seed: int
) -> dict[str, Any]:
    """B12's own settings until 2026-12-07: one optimiser update a step at learning rate
    0.01 (it learns to end turns in about half the steps 0.003 takes), temperature 1."""
    return {  # named by make_spec
        "model": {"source": "builtin:tiny"},
        "environment": {"name": env_id},
        "agent": dict(AGENT),
        "rollout": {"group_size": G, "concurrency": c, "sampling": {"temperature": 1.0}},
        "algorithm": {"batch_groups": B, "learning_rate": 0.01},
        "staleness": {"mode": staleness_mode, "max_staleness": m},
        "train": {"steps": steps, "seed": seed},
    }


def example_spec(
    env_id: str, staleness_mode: str, c: int, steps: int, m: int, seed: int
) -> dict[str, Any]:
    """The workload as a user runs it, on examples/tiny-game.yaml's settings.

    What defines the workload is B12's (the environment, C, N = 16 episodes a step, the
    staleness bound, 32 turns of 8 tokens in a 512-token context: the example's 96 would
    cut its episodes short); everything else (sampling temperature, learning rate and its
    schedule, mini-batches and epochs, clipping, entropy floor, the advantage's scaling)
    is the example's. N = 16 is 4 groups of 4: the example's mini-batches (2) must divide
    the groups of a step, so its group of 16 cannot make one group a step.
    """
    spec = yaml.safe_load((REPO / "examples" / "tiny-game.yaml").read_text())
    spec["environment"] = {"name": env_id}
    spec["agent"] = dict(AGENT)
    spec["rollout"]["concurrency"] = c
    spec["rollout"]["group_size"] = G
    spec["algorithm"]["batch_groups"] = B
    spec["staleness"] = {"mode": staleness_mode, "max_staleness": m}
    spec["train"] = {"steps": steps, "seed": seed}
    return spec  # type: ignore[no-any-return]


def train_spans(client: Client, run_id: str) -> list[tuple[float, float]]:
    """The run's train_step spans, paging through its whole timeline."""
    out: list[tuple[float, float]] = []
    start: int | None = None
    while True:
        page = client.timeline(run_id, start_us=start, limit=100_000)
        out += [
            (s.start_us / 1e6, (s.start_us + s.dur_us) / 1e6)
            for s in page.spans
            if s.name == "train_step"
        ]
        if not page.truncated:
            return sorted(set(out))
        start = page.next_start_us


def start_env_server(dep: Deployment, secret: str) -> str:
    """The long-tail environment server, in a process of its own; its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "bench._longtail_env", "--port", str(port)]
    dep.start("envserver", argv, {"RLAAS_ENV_SECRET": secret})
    url = f"http://127.0.0.1:{port}"
    dep.wait_ready("envserver", f"{url}/healthz")
    return url


def run_once(
    dep: Deployment, env_url: str, client: Client, env_id: str, mode: str, c: int, steps: int,
    m: int, seed: int,
) -> Run:  # fmt: skip
    spec = make_spec(env_id, mode, c, steps, m, seed)
    started = time.time()
    with CpuSampler(dep.procs["worker"].pid) as cpu:
        run = client.create_run(spec)
        try:
            final = client.wait(run.id, timeout_s=600 + 30 * steps, interval_s=1.0)
        except TimeoutError:
            client.cancel(run.id)
            raise
    if final.status != "succeeded":
        raise RuntimeError(f"run {run.id} ended {final.status}: {final.error}")
    metrics: dict[int, dict[str, float]] = {}
    for point in client.metrics(run.id):
        metrics.setdefault(point.step, {})[point.name] = point.value
    stats = httpx.get(f"{env_url}/bench/stats", params={"run": run.id}, timeout=60).json()
    fields = stats["fields"]
    return Run(
        mode=mode,
        c=c,
        seed=seed,
        run_id=run.id,
        wall_s=time.time() - started,
        metrics=metrics,
        train_spans=train_spans(client, run.id),
        episodes=[dict(zip(fields, e, strict=True)) for e in stats["episodes"]],
        calls=int(stats["calls"]),
        samples=[tuple(s) for s in stats["samples"]],  # type: ignore[misc]
        cpu=cpu.points,
    )


# --- figures ----------------------------------------------------------------------


def at(points: Sequence[tuple[float, float]], t: float) -> float:
    """A cumulative series read at ``t``, linearly between its samples."""
    for (t1, y1), (t2, y2) in itertools.pairwise(points):
        if t1 <= t <= t2:
            return y1 + (y2 - y1) * (t - t1) / max(t2 - t1, 1e-9)
    return points[0][1] if t < points[0][0] else points[-1][1]


def time_mean(points: Sequence[tuple[float, float]]) -> float:
    """The mean over time of a series sampled at uneven moments (a busy loop samples late)."""
    pairs = list(itertools.pairwise(points))
    return sum(y * (t2 - t1) for (t1, y), (t2, _) in pairs) / (points[-1][0] - points[0][0])


@dataclasses.dataclass
class Figures:
    steps: int
    first: int  # the window's first step (its batch's train step starts it)
    warm: int  # the last step in which the model had not learned to end its turns
    traj_s: float
    steps_s: float
    w: float
    w_p95: float
    w_env: float
    l_mean: float
    calls_s: float  # env calls the server answered per second (one step per model call)
    overhead_ms: float  # per env call: the worker's wait on it less the server's sleep
    t_step: float
    blocked: float
    engine_busy: float
    reused: float  # the share of prompt tokens the engine took from its prefix pool
    cpu_call_ms: float  # over the window
    cpu_call_run_ms: float  # over the whole run
    started: int
    trained: int
    truncated: int  # played (and trained on) but cut by a limit: the warm-up's
    reasons: dict[str, int]  # why the rest were never trained on


def warm_up(run: Run) -> int:
    """The last step in which over a fifth of the episodes that ended were truncated: the
    random model had not yet learned to end its turns (bench/_longtail_env.py)."""
    last = 0
    for step, m in sorted(run.metrics.items()):
        truncated = m.get("episode/truncated", 0.0)
        if truncated > 0.2 * (truncated + m.get("episode/done", 0.0)):
            last = step
    return last


def figures(run: Run) -> Figures:
    n = len(run.metrics)
    if len(run.train_spans) != n:
        print(f"  note: {len(run.train_spans)} train_step spans for {n} steps", flush=True)
    n = min(n, len(run.train_spans))
    warm = warm_up(run)
    # The window opens at the train step of step k + 1 (0-based span k): after the warm-up
    # and the first fifth of the steps that follow it (the longer episodes that follow the
    # warm-up bring new shapes to compile, seconds each); a run too short for that falls
    # back to the steps after the first fifth.
    k = max(1, warm + (n - warm) // 5)
    if n - 1 - k < 3:
        print(f"  note: {run.mode} is still warming up at step {warm} of {n}: the window "
              "includes it; run more --steps", flush=True)  # fmt: skip
        k = max(1, n // 5)
    t0, t1 = run.train_spans[k][0], run.train_spans[n - 1][0]
    window = range(k + 2, n + 1)  # steps whose batch came in (t0, t1]: 1-based k+2..n
    trained = sum(run.metrics[s].get("episode/trained", 0.0) for s in window)
    ended = [e for e in run.episodes if e["end_t"] is not None and t0 <= e["end_t"] <= t1]
    w = [e["end_t"] - e["reset_t"] for e in ended]
    inside = [(t, float(o)) for t, o, _, _ in run.samples if t0 <= t <= t1]
    calls = [(t, float(done)) for t, _, done, _ in run.samples]
    n_calls = max(at(calls, t1) - at(calls, t0), 1.0)
    slept = [(t, z) for t, _, _, z in run.samples]
    cpu = at(run.cpu, t1) - at(run.cpu, t0)
    step_s = {s: run.metrics[s]["step_time_s"] for s in window}

    def weighted(name: str) -> float:  # a per-step share, over the window's time
        return sum(run.metrics[s][name] * t for s, t in step_s.items()) / sum(step_s.values())

    def mean(name: str) -> float:
        return statistics.fmean(run.metrics[s][name] for s in window)

    def total(name: str) -> int:
        return round(sum(m.get(name, 0.0) for m in run.metrics.values()))

    # The worker's env_step spans (its reset, step and close calls, as the agent waits on
    # them) less the server's sleeps in the same window: the webhook path's own time.
    waited = sum(run.metrics[s]["time/env_step_s"] for s in window)

    started, done = len(run.episodes), total("episode/trained")
    failed = sum(total(f"failures/{r}") for r in FAILURES)
    reasons = {
        "stale untrained": total("stale/episodes_untrained"),
        "groups dropped stale": total("groups/dropped_stale"),
        "groups dropped failed": total("groups/dropped_failed"),
        "failed": failed,
        "cancelled": total("episode/cancelled"),
    }
    # What the metrics do not name: finished episodes waiting in the queue (or for their
    # group's straggler) and episodes in flight when the last step was trained. Failed
    # episodes are among their dropped groups' members.
    dropped = reasons["groups dropped stale"] + reasons["groups dropped failed"]
    named = reasons["stale untrained"] + reasons["cancelled"] + G * dropped
    reasons["left at the stop"] = max(0, started - done - named)
    return Figures(
        steps=n,
        first=k + 1,
        warm=warm,
        traj_s=trained / (t1 - t0),
        steps_s=(n - 1 - k) / (t1 - t0),
        w=statistics.fmean(w),
        w_p95=percentile(w, 95),
        w_env=statistics.fmean(e["env_s"] for e in ended),
        l_mean=time_mean(inside),
        calls_s=n_calls / (t1 - t0),
        overhead_ms=1e3 * (waited - (at(slept, t1) - at(slept, t0))) / n_calls,
        t_step=mean("time/train_step_s") + mean("time/weight_sync_s"),
        blocked=weighted("trainer/blocked_frac"),
        engine_busy=weighted("engine/busy_frac"),
        reused=statistics.fmean(
            run.metrics[s].get("engine/prefix_reused_frac", 0.0) for s in window
        ),
        cpu_call_ms=1e3 * cpu / n_calls,
        cpu_call_run_ms=1e3 * (run.cpu[-1][1] - run.cpu[0][1]) / max(run.calls, 1),
        started=started,
        trained=done,
        truncated=total("episode/truncated"),
        reasons=reasons,
    )


def inflight_svg(runs: Sequence[Run], c: int) -> str:
    """Episodes open over each run, at most one point a second (the figure is kept in git)."""
    lines = {}
    for run in runs:
        start = min(e["reset_t"] for e in run.episodes)
        end = max(e["close_t"] or e["end_t"] or start for e in run.episodes)
        inside = [(t, o) for t, o, _, _ in run.samples if start <= t <= end]
        every = max(1, round(1.0 / SAMPLE_S))
        lines[run.mode] = [(t - start, float(o)) for t, o in inside[::every]]
    return svg_plot(lines, c, f"B12 through the stack, C = {c}: episodes open at the environment")


# --- the report -------------------------------------------------------------------


def report(results: list[tuple[Run, Figures]], m: int) -> list[str]:
    rows, loss, out = [], [], []
    for run, f in results:
        rows.append([run.mode, run.c, run.seed, f"{f.first}-{f.steps}", f"{run.wall_s:.0f}",
                     f"{f.traj_s:.2f}", f"{f.steps_s:.3f}", f"{f.w:.2f}", f"{f.w_p95:.2f}",
                     f"{f.w_env:.2f}", f"{f.w / f.w_env:.2f}", f"{f.l_mean:.1f}",
                     f"{f.l_mean / run.c:.2f}", f"{run.c / f.w:.1f}", f"{run.c / f.w_env:.1f}",
                     f"{N / f.t_step:.1f}", f"{f.t_step:.2f}", f"{f.blocked:.0%}",
                     f"{f.engine_busy:.0%}", f"{f.reused:.0%}", f"{f.calls_s:.0f}",
                     f"{f.overhead_ms:.1f}",
                     f"{f.cpu_call_ms:.1f}", f"{f.cpu_call_run_ms:.1f}"])  # fmt: skip
        never = f.started - f.trained
        loss.append([run.mode, run.c, run.seed, f.warm, f.truncated, f.started, f.trained, never,
                     f"{never / max(f.started, 1):.1%}",
                     *(f.reasons[r] for r in f.reasons)])  # fmt: skip
    out.append(table(
        ["mode", "C", "seed", "window", "wall s", "traj/s", "steps/s", "E[W] s", "p95 W",
         "E[Wenv]", "W/Wenv", "L", "L/C", "C/E[W]", "C/E[Wenv]", "N/T", "T_step",
         "blocked", "engine busy", "prompt reused", "env calls/s", "call overhead ms",
         "wkr CPU ms/call",
         "(whole run)"],
        rows,
    ))  # fmt: skip
    out.append(f"N = {N} ({B} groups of {G}), max_staleness {m}. Window: the steps after the "
               "warm-up and the first fifth of those that follow it; W (reset to the step "
               "that said done), W_env (its sleeps) and L (episodes open) by the environment "
               "server's clock; "
               "worker CPU: its process tree, per env call the server answered (resets, "
               "steps, closes), model calls and training included.")  # fmt: skip
    out.append("")
    out.append(table(
        ["mode", "C", "seed", "warm-up to step", "truncated", "started", "trained", "never",
         "share", *results[0][1].reasons],
        loss,
    ))  # fmt: skip
    out.append("Episodes started (the server's resets) and trained on (episode/trained), whole "
               "run; why the rest were not, from the run's metrics (groups: 4 episodes each); "
               "'left at the stop' by difference. Truncated episodes (the warm-up's) are "
               "trained on.")  # fmt: skip
    out.append("")
    by = {(r.mode, r.c, r.seed): f for r, f in results}
    for (mode, c, seed), f in by.items():
        if not mode.startswith("async"):
            continue
        # Against the sync run of the same variants (async-lean against sync-lean), else sync.
        twin = "sync" + mode.removeprefix("async")
        base = twin if (twin, c, seed) in by else "sync"
        sync = by.get((base, c, seed))
        if sync:
            out.append(f"{mode} C={c} seed {seed}: "
                       f"{mode}/{base} traj/s = {f.traj_s / sync.traj_s:.2f}x, "
                       f"steps/s = {f.steps_s / sync.steps_s:.2f}x")  # fmt: skip
        checks = [
            ("episodes in flight L ≥ 0.9 C", f.l_mean >= 0.9 * c, f"{f.l_mean / c:.2f} C"),
            ("E[W] ≤ 1.3 E[W_env]", f.w <= 1.3 * f.w_env, f"{f.w / f.w_env:.2f}"),
            ("traj/s ≥ 0.4 C/E[W_env]", f.traj_s >= 0.4 * c / f.w_env,
             f"{f.traj_s / (c / f.w_env):.2f} of C/E[W_env]"),
        ]  # fmt: skip
        for name, ok, value in checks:
            out.append(f"  {'PASS' if ok else 'MISS'}  {mode} C={c} seed {seed}: {name}: {value}")
        out.append(f"  (reported) worker CPU per env call: {f.cpu_call_ms:.1f} ms (window), "
                   f"{f.cpu_call_run_ms:.1f} ms (whole run)")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="12 steps a run: a smoke run, still warming up"
    )
    parser.add_argument("--steps", type=int, default=60, help="train steps per run")
    parser.add_argument("--concurrency", default="64", help="C values, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="seeds 0..R-1, each mode per seed")
    parser.add_argument("--max-staleness", type=int, default=3)
    parser.add_argument(
        "--modes",
        default="sync,async",
        help="sync or async (examples/tiny-game.yaml's settings), each with variants after "
        "dashes: -lean (B12's settings until 2026-12-07), -reuse (the engine's prefix pool), "
        "-nofit (train.fit_compiled off); e.g. async,async-lean,async-lean-reuse",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "figures")
    parser.add_argument("--dump", type=Path, help="a folder for each run's raw data (JSON)")
    args = parser.parse_args()
    steps = 12 if args.quick else args.steps
    cs = [int(c) for c in args.concurrency.split(",")]
    modes = args.modes.split(",")
    results: list[tuple[Run, Figures]] = []
    with deployment() as dep, Client(dep.api_url, dep.api_key) as client:
        secret = secrets.token_urlsafe(32)
        env_url = start_env_server(dep, secret)
        # At most one call per episode is in flight: 2 C slots never hold a call back.
        env = client.register_environment(
            "b12-long-tail", env_url, secret, max_concurrency=2 * max(cs)
        )
        check = client.check_environment(env.id)
        if not check.ok:
            raise RuntimeError(f"the environment check failed: {check.error}")
        print(f"deployment up; environment {env.id} at {env_url}", flush=True)
        for c, seed, mode in itertools.product(cs, range(args.repeats), modes):
            run = run_once(dep, env_url, client, env.id, mode, c, steps, args.max_staleness, seed)
            if args.dump:
                args.dump.mkdir(parents=True, exist_ok=True)
                path = args.dump / f"b12_{mode}_C{c}_seed{seed}.json"
                path.write_text(json.dumps(dataclasses.asdict(run)))
            results.append((run, figures(run)))
            print(f"  ran {mode} C={c} seed {seed}: {run.run_id}, {run.wall_s:.0f} s", flush=True)
    print("\n".join(report(results, args.max_staleness)))
    first = [r for r, _ in results if r.c == cs[0] and r.seed == 0]
    if first:
        args.out.mkdir(parents=True, exist_ok=True)
        svg = args.out / "b12_inflight.svg"
        svg.write_text(inflight_svg(first, cs[0]))
        print(f"wrote {svg}")


if __name__ == "__main__":
    main()
