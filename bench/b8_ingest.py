"""B8: metric ingest into Postgres through the API.

    .venv/bin/python bench/b8_ingest.py [--quick]

Candidate: workers post numbered batches of points to
``POST /internal/runs/{id}/metrics`` on a real uvicorn + Postgres (one
transaction and one ``unnest`` upsert per batch). Phases, back to back:

1. capacity: closed loop, as fast as the server answers;
2. sustained: open loop at the target rate (50k points/s);
3. overload: open loop at 2x capacity; every batch is retried with its seq
   until stored, and the database must then hold every point exactly once.

Baseline, same run and same Postgres: one ``INSERT`` per point, autocommit,
over as many connections as the candidate has workers.

Targets (docs/benchmarks.md): >= 50k points/s sustained; p99 request <= 100 ms;
nothing lost at 2x overload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import Stack, percentile, sleep_until, stack, table

TARGET = 50_000  # points/s
NAMES = [f"metric/{i:02d}" for i in range(20)]


@dataclass
class Runs:
    """Each run's next step and seq: batches never repeat a point, retries repeat a seq."""

    ids: list[str]
    steps_per_batch: int
    next_step: dict[str, int] = field(default_factory=dict)
    next_seq: dict[str, int] = field(default_factory=dict)
    turn: int = 0

    def batch(self) -> tuple[str, int, bytes, int]:
        run_id = self.ids[self.turn % len(self.ids)]
        self.turn += 1
        step = self.next_step.get(run_id, 0)
        seq = self.next_seq.get(run_id, 0)
        self.next_step[run_id] = step + self.steps_per_batch
        self.next_seq[run_id] = seq + 1
        points = [
            {"step": s, "name": n, "value": s * 0.001}
            for s in range(step, step + self.steps_per_batch)
            for n in NAMES
        ]
        body = json.dumps({"worker_id": "bench", "seq": seq, "points": points}).encode()
        return run_id, seq, body, len(points)


@dataclass
class Phase:
    name: str
    offered: float | None = None  # points/s asked for (None: closed loop)
    points: int = 0
    latencies: list[float] = field(default_factory=list)
    retries: int = 0
    duplicates: int = 0
    wall_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.points / self.wall_s if self.wall_s else 0.0


async def post(client: httpx.AsyncClient, stack_: Stack, run_id: str, body: bytes, phase: Phase,
               n: int) -> None:  # fmt: skip
    """Post one batch until it is stored (same seq every try: a retry is deduplicated)."""
    headers = {**stack_.lease(run_id), "Content-Type": "application/json"}
    while True:
        start = time.perf_counter()
        try:
            r = await client.post(f"/internal/runs/{run_id}/metrics", content=body, headers=headers)
        except httpx.TransportError:
            phase.retries += 1
            await asyncio.sleep(0.1)
            continue
        if r.status_code == 200:
            phase.latencies.append(time.perf_counter() - start)
            # A duplicate answer: an earlier try was stored and its answer lost. Count it once.
            phase.duplicates += int(r.json()["duplicate"])
            phase.points += n
            return
        if r.status_code < 500 and r.status_code != 429:
            raise RuntimeError(f"batch refused: {r.status_code} {r.text[:300]}")
        phase.retries += 1
        await asyncio.sleep(0.1)


async def closed_loop(client: httpx.AsyncClient, st: Stack, runs: Runs, workers: int,
                      duration: float) -> Phase:  # fmt: skip
    phase = Phase("capacity (closed loop)")
    deadline = time.monotonic() + duration

    async def worker() -> None:
        while time.monotonic() < deadline:
            run_id, _, body, n = runs.batch()
            await post(client, st, run_id, body, phase, n)

    start = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for _ in range(workers):
            group.create_task(worker())
    phase.wall_s = time.monotonic() - start
    return phase


async def open_loop(client: httpx.AsyncClient, st: Stack, runs: Runs, name: str, rate: float,
                    duration: float, batch_points: int) -> Phase:  # fmt: skip
    """Batches at fixed times whatever the answers; the rate achieved includes draining."""
    phase = Phase(name, offered=rate)
    interval = batch_points / rate
    count = int(duration / interval)
    start = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for i in range(count):
            await sleep_until(start + i * interval)
            run_id, _, body, n = runs.batch()
            group.create_task(post(client, st, run_id, body, phase, n))
    phase.wall_s = time.monotonic() - start
    return phase


async def baseline(st: Stack, run_ids: list[str], duration: float) -> Phase:
    phase = Phase("baseline: INSERT per point, autocommit")
    deadline = time.monotonic() + duration

    async def one(run_id: str) -> None:
        async with await psycopg.AsyncConnection.connect(st.libpq_url, autocommit=True) as conn:
            step = 10_000_000
            while time.monotonic() < deadline:
                for name in NAMES:
                    t = time.perf_counter()
                    await conn.execute(
                        "INSERT INTO metric_points (run_id, name, step, value) "
                        "VALUES (%s, %s, %s, %s)",
                        (run_id, name, step, 1.0),
                    )
                    phase.latencies.append(time.perf_counter() - t)
                    phase.points += 1
                step += 1

    start = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for run_id in run_ids:
            group.create_task(one(run_id))
    phase.wall_s = time.monotonic() - start
    return phase


async def stored(st: Stack, run_ids: list[str]) -> int:
    async with await psycopg.AsyncConnection.connect(st.libpq_url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM metric_points WHERE run_id = ANY(%s) AND step < 10000000",
            (run_ids,),
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def main(quick: bool, api_workers: int) -> int:
    duration = 6.0 if quick else 20.0
    workers, n_runs, steps_per_batch = 8, 16, 50
    batch_points = steps_per_batch * len(NAMES)
    with stack(uvicorn_args=["--workers", str(api_workers)]) as st:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(base_url=st.base_url, timeout=60, limits=limits) as client:
            run_ids = await st.running_runs(client, n_runs, "bench")
            runs = Runs(run_ids, steps_per_batch)
            warm = await closed_loop(client, st, runs, workers, 1.5)
            capacity = await closed_loop(client, st, runs, workers, duration)
            sustained = await open_loop(client, st, runs, f"sustained at {TARGET:,}/s", TARGET,
                                        duration, batch_points)  # fmt: skip
            over = 2 * max(capacity.rate, TARGET)
            overload = await open_loop(client, st, runs, f"2x overload ({over:,.0f}/s)", over,
                                       duration, batch_points)  # fmt: skip
            sent = sum(p.points for p in (warm, capacity, sustained, overload))
            in_db = await stored(st, run_ids)
        base = await baseline(st, run_ids, duration)
    rows = []
    for p in (capacity, sustained, overload, base):
        ms = [x * 1000 for x in p.latencies]
        rows.append([p.name, f"{p.offered:,.0f}" if p.offered else "-", p.rate,
                     percentile(ms, 50), percentile(ms, 99), p.retries, p.duplicates])  # fmt: skip
    print(f"B8 metrics ingest: {n_runs} runs, {workers} closed-loop workers, "
          f"{batch_points} points per batch, {duration:.0f} s per phase, "
          f"{api_workers} API process(es)")  # fmt: skip
    print(table(["phase", "offered pts/s", "stored pts/s", "p50 ms", "p99 ms", "retries",
                 "dup answers"], rows))  # fmt: skip
    lost = sent - in_db
    sustained_p99 = percentile([x * 1000 for x in sustained.latencies], 99)
    print(f"\ncandidate capacity / baseline: {capacity.rate / base.rate:,.1f}x "
          f"({capacity.rate:,.0f} vs {base.rate:,.0f} points/s)")  # fmt: skip
    print(f"points acknowledged {sent:,}; in the database {in_db:,}; lost {lost:,}")
    verdicts = [
        ("sustained >= 50k points/s", sustained.rate >= 0.98 * TARGET),
        ("p99 request <= 100 ms at the target rate", sustained_p99 <= 100),
        ("nothing lost at 2x overload", lost == 0),
    ]
    for text, ok in verdicts:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 s phases (about a minute)")
    parser.add_argument("--api-workers", type=int, default=1, help="uvicorn processes")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.quick, args.api_workers)))
