"""Soak: a deployment under steady load for a long time; does anything grow?

    .venv/bin/python bench/soak.py [--minutes 30] [--sample-s 30] [--subscribers 100]
        [--pollers 8] [--ingest-hz 20] [--warmup-minutes 10] [--out bench/figures] [--dump F]

The whole stack as an operator starts it (``bench/_deployment.py``: PostgreSQL,
Redis, ``rlaas serve``, one ``rlaas worker``), and for ``--minutes``:

- a training run (``examples/tiny-game.yaml``, steps enough to outlast the
  soak, cancelled at the end) on the real worker;
- steady ingest: a second run claimed as a worker would (shared token for the
  claim, its lease token after), fed a metrics batch of 5 steps x 4 names
  ``--ingest-hz`` times a second, heartbeats every 10 s;
- polling: ``--pollers`` clients each reading the training run twice a second;
- ``--subscribers`` live metrics streams (SSE) on the training run, each
  reconnecting if cut.

Every ``--sample-s`` it records the API's and the worker's resident memory and
open file descriptors (psutil, each process tree), the database's connections
(``pg_stat_activity``), and the p50/p99 latency of the polls and ingest posts
in that interval. At the end: a table of the samples, and per series the
least-squares slope after the warm-up (``--warmup-minutes``: compiling and
filling caches) with its 95 % confidence interval and the
change it predicts over an hour; a series is called flat when the interval
holds 0 or the hour's change is under 5 % of its mean. ``--out`` gets
``soak.svg``, each series over time scaled to its own maximum. Not a test:
CI does not run it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._deployment import Deployment, deployment
from bench.b8_stack import REPO, percentile, table

NAMES = ("reward/mean", "loss", "kl", "entropy")
SERIES = (
    "api_rss_mb",
    "api_fds",
    "worker_rss_mb",
    "worker_fds",
    "db_connections",
    "poll_p50_ms",
    "poll_p99_ms",
    "ingest_p99_ms",
)


@dataclasses.dataclass
class Load:
    """Latencies since the last sample, and what the streams received."""

    polls: list[float] = dataclasses.field(default_factory=list)
    posts: list[float] = dataclasses.field(default_factory=list)
    poll_errors: int = 0
    post_errors: int = 0
    stream_events: int = 0
    stream_reconnects: int = 0

    def take(self) -> tuple[list[float], list[float]]:
        polls, posts, self.polls, self.posts = self.polls, self.posts, [], []
        return polls, posts


def tree_usage(pid: int) -> tuple[float, int]:
    """Resident MB and open file descriptors of a process and its children."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return math.nan, 0
    rss, fds = 0, 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            rss += p.memory_info().rss
            fds += p.num_fds()
    return rss / 2**20, fds


def db_connections(database_url: str) -> int:
    conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) - 1 if row else 0  # not this one


async def poller(client: httpx.AsyncClient, run_id: str, load: Load, stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        try:
            r = await client.get(f"/v1/runs/{run_id}")
            r.raise_for_status()
            load.polls.append(time.perf_counter() - start)
        except httpx.HTTPError:
            load.poll_errors += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def subscriber(base: str, key: str, run_id: str, load: Load, stop: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None) as client:
        while not stop.is_set():
            try:
                async with client.stream("GET", f"/v1/runs/{run_id}/metrics/stream") as r:
                    async for line in r.aiter_lines():
                        load.stream_events += line.startswith("data:")
                        if stop.is_set():
                            return
            except httpx.HTTPError:
                pass
            load.stream_reconnects += 1
            await asyncio.sleep(0.5)


async def ingest(
    client: httpx.AsyncClient, worker_token: str, hz: float, load: Load, stop: asyncio.Event
) -> None:
    """Claim a run as a worker does, then post metrics batches at ``hz`` until told to stop."""
    spec = {"environment": {"name": "guess_number"}, "train": {"steps": 1_000_000}}
    run = (await client.post("/v1/runs", json={"spec": spec})).json()["id"]
    claim = await client.post(
        f"/internal/runs/{run}/claim",
        json={"worker_id": "soak", "lease_seconds": 60},
        headers={"Authorization": f"Bearer {worker_token}"},
    )
    claim.raise_for_status()
    lease = {"Authorization": f"Bearer {claim.json()['lease_token']}"}
    await client.post(
        f"/internal/runs/{run}/status",
        json={"worker_id": "soak", "status": "running"},
        headers=lease,
    )
    seq, step, beat = 0, 0, time.monotonic()
    period = 1.0 / hz
    next_t = time.monotonic()
    while not stop.is_set():
        points = [
            {"step": s, "name": n, "value": s * 1e-3} for s in range(step, step + 5) for n in NAMES
        ]
        body = json.dumps({"worker_id": "soak", "seq": seq, "points": points}).encode()
        start = time.perf_counter()
        try:
            r = await client.post(
                f"/internal/runs/{run}/metrics",
                content=body,
                headers={**lease, "Content-Type": "application/json"},
            )
            r.raise_for_status()
            load.posts.append(time.perf_counter() - start)
            seq, step = seq + 1, step + 5
        except httpx.HTTPError:
            load.post_errors += 1
        if time.monotonic() - beat > 10:
            beat = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                await client.post(
                    f"/internal/runs/{run}/heartbeat",
                    json={"worker_id": "soak", "lease_seconds": 60},
                    headers=lease,
                )
        next_t += period
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_t - time.monotonic()))


def sample(dep: Deployment, load: Load, t0: float) -> dict[str, float]:
    polls, posts = load.take()
    api_rss, api_fds = tree_usage(dep.procs["api"].pid)
    worker_rss, worker_fds = tree_usage(dep.procs["worker"].pid)
    ms = 1e3
    return {
        "t_s": time.monotonic() - t0,
        "api_rss_mb": api_rss,
        "api_fds": float(api_fds),
        "worker_rss_mb": worker_rss,
        "worker_fds": float(worker_fds),
        "db_connections": float(db_connections(dep.env["RLAAS_DATABASE_URL"])),
        "poll_p50_ms": ms * percentile(polls, 50) if polls else math.nan,
        "poll_p99_ms": ms * percentile(polls, 99) if polls else math.nan,
        "ingest_p99_ms": ms * percentile(posts, 99) if posts else math.nan,
        "polls": float(len(polls)),
        "posts": float(len(posts)),
    }


def slope(ts: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope per second and its 95 % half-width (t quantile for n - 2)."""
    pairs = [(t, y) for t, y in zip(ts, ys, strict=True) if not math.isnan(y)]
    n = len(pairs)
    if n < 3:
        return math.nan, math.nan
    mt = statistics.fmean(t for t, _ in pairs)
    my = statistics.fmean(y for _, y in pairs)
    sxx = sum((t - mt) ** 2 for t, _ in pairs)
    b = sum((t - mt) * (y - my) for t, y in pairs) / sxx
    residual = sum((y - my - b * (t - mt)) ** 2 for t, y in pairs)
    se = math.sqrt(residual / (n - 2) / sxx)
    return b, t95(n - 2) * se


def t95(dof: int) -> float:
    """Student's t quantile for a 95 % interval: the table's entry at or below ``dof`` (a
    wider interval where it has none), 1.96 past 60 degrees of freedom."""
    if dof > 60:
        return 1.96
    return T95[max(k for k in T95 if k <= dof)]


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04, 40: 2.02, 60: 2.00}  # fmt: skip


def report(samples: list[dict[str, float]], warmup_s: float) -> list[str]:
    out = [table(["t s", *SERIES], [[f"{s['t_s']:.0f}", *(f"{s[k]:.1f}" for k in SERIES)]
                                    for s in samples])]  # fmt: skip
    # Slopes after the warm-up: a worker's first minutes compile its programs and fill
    # its caches, growth that stops; the question is whether anything grows after that.
    steady = [s for s in samples if s["t_s"] >= warmup_s] or samples
    ts = [s["t_s"] for s in steady]
    rows = []
    for name in SERIES:
        ys = [s[name] for s in steady]
        b, half = slope(ts, ys)
        mean = statistics.fmean(y for y in ys if not math.isnan(y)) if ys else math.nan
        hour = 3600 * b
        flat = (abs(b) <= half) or abs(hour) < 0.05 * abs(mean)
        rows.append([name, f"{mean:.1f}", f"{b:+.4f} ± {half:.4f}", f"{hour:+.1f}",
                     "flat" if flat else "GROWS" if b > 0 else "falls"])  # fmt: skip
    out.append("")
    out.append(f"After the first {warmup_s:.0f} s ({len(steady)} samples):")
    out.append(table(["series", "mean", "slope per s (95 %)", "per hour", "verdict"], rows))
    return out


def svg(samples: list[dict[str, float]]) -> str:
    """Each series over time, scaled to its own maximum (0..1)."""
    width, height, pad = 760, 340, 44
    t_max = max(s["t_s"] for s in samples) or 1.0
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f"]  # fmt: skip
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{pad}" y="18">Soak: each series over time, as a share of its maximum</text>',
        f'<polyline points="{pad},{pad} {pad},{height - pad} {width - pad},{height - pad}" '
        'fill="none" stroke="black"/>',
        f'<text x="{width / 2 - 20}" y="{height - 10}">seconds (0 to {t_max:.0f})</text>',
    ]
    for i, name in enumerate(SERIES):
        points = [(s["t_s"], s[name]) for s in samples if not math.isnan(s[name])]
        top = max((v for _, v in points), default=0.0) or 1.0
        xy = " ".join(
            f"{pad + (width - 2 * pad - 140) * t / t_max:.1f},"
            f"{height - pad - (height - 2 * pad) * v / top:.1f}"
            for t, v in points
        )
        parts.append(f'<polyline points="{xy}" fill="none" stroke="{colours[i]}"/>')
        parts.append(f'<text x="{width - 170}" y="{40 + 16 * i}" fill="{colours[i]}">{name}</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


async def soak(dep: Deployment, args: argparse.Namespace) -> list[dict[str, float]]:
    headers = {"Authorization": f"Bearer {dep.api_key}"}
    limits = httpx.Limits(max_connections=args.pollers + 8)
    async with httpx.AsyncClient(
        base_url=dep.api_url, headers=headers, timeout=30, limits=limits
    ) as client:
        spec: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny-game.yaml").read_text())
        spec["train"]["steps"] = 100_000  # outlasts the soak; cancelled at the end
        created = await client.post("/v1/runs", json={"spec": spec})
        created.raise_for_status()
        run_id = created.json()["id"]
        load, stop = Load(), asyncio.Event()
        tasks = [
            asyncio.create_task(ingest(client, dep.env["RLAAS_WORKER_TOKEN"], args.ingest_hz,
                                       load, stop)),
            *(asyncio.create_task(poller(client, run_id, load, stop)) for _ in range(args.pollers)),
            *(asyncio.create_task(subscriber(dep.api_url, dep.api_key, run_id, load, stop))
              for _ in range(args.subscribers)),
        ]  # fmt: skip
        t0 = time.monotonic()
        samples: list[dict[str, float]] = []
        end = t0 + 60 * args.minutes
        while time.monotonic() < end:
            await asyncio.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
            samples.append(await asyncio.to_thread(sample, dep, load, t0))
            s = samples[-1]
            print(f"  t={s['t_s']:.0f}s api {s['api_rss_mb']:.0f} MB/{s['api_fds']:.0f} fds, "
                  f"worker {s['worker_rss_mb']:.0f} MB, db {s['db_connections']:.0f}, poll p99 "
                  f"{s['poll_p99_ms']:.1f} ms, ingest p99 {s['ingest_p99_ms']:.1f} ms, "
                  f"stream events {load.stream_events}", flush=True)  # fmt: skip
        stop.set()
        await asyncio.wait(tasks, timeout=30)
        for task in tasks:
            task.cancel()
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        await client.post(f"/v1/runs/{run_id}/cancel")
    print(f"training run at step {run['current_step']} ({run['status']}); poll errors "
          f"{load.poll_errors}, ingest errors {load.post_errors}, stream events "
          f"{load.stream_events}, stream reconnects {load.stream_reconnects}")  # fmt: skip
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--pollers", type=int, default=8)
    parser.add_argument("--ingest-hz", type=float, default=20.0)
    parser.add_argument("--warmup-minutes", type=float, default=10.0, help="left out of slopes")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "figures")
    parser.add_argument("--dump", type=Path, help="write the samples here as JSON")
    args = parser.parse_args()
    with deployment() as dep:
        samples = asyncio.run(soak(dep, args))
    if args.dump:
        args.dump.write_text(json.dumps(samples))
    print("\n".join(report(samples, 60 * args.warmup_minutes)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.svg").write_text(svg(samples))
    print(f"wrote {args.out / 'soak.svg'}")


if __name__ == "__main__":
    main()
