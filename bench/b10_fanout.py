"""B10: live metrics fan-out over SSE to 100 / 500 / 1,000 subscribers of one run.

    .venv/bin/python bench/b10_fanout.py [--quick]

A publisher posts one step at a time (``POST /internal/runs/{id}/metrics``,
the point's value is the wall-clock time it was sent); N subscribers hold
``GET /v1/runs/{id}/metrics/stream`` open on uvicorn + Postgres (the path
runs through NOTIFY/LISTEN and the run's feed) and note when each step
arrives. Delivery latency = arrival - send time. Baseline: one subscriber,
same publisher. The largest case adds stalled subscribers that never read:
the publisher and the others must not notice them.

Subscribers are bare asyncio sockets (an HTTP client per stream would measure
the client). Targets: p95 <= 20 / 50 / 100 ms at 100 / 500 / 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import Stack, percentile, stack, table

TARGETS = {1: None, 100: 20.0, 500: 50.0, 1000: 100.0}


@dataclass
class Case:
    subscribers: int
    stalled: int = 0
    arrivals: list[float] = field(default_factory=list)  # seconds after the send
    posts: list[float] = field(default_factory=list)
    connected: int = 0
    steps: int = 0


async def subscriber(st: Stack, run_id: str, case: Case, stop: asyncio.Event,
                     stalled: bool) -> None:  # fmt: skip
    """One stream, read until ``stop`` (a stalled one never reads)."""
    reading = asyncio.ensure_future(_subscribe(st, run_id, case, stalled))
    await stop.wait()
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading


async def _subscribe(st: Stack, run_id: str, case: Case, stalled: bool) -> None:
    url = urlsplit(st.base_url)
    sock = socket.socket()
    if stalled:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (url.hostname, url.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        f"GET /v1/runs/{run_id}/metrics/stream HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {st.api_key}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        if stalled:
            case.connected += 1
            await asyncio.Event().wait()  # never reads: its window fills, the send blocks
        # Chunks, not lines: a wait_for per line made a task per line, and at a thousand
        # subscribers that client-side cost landed in the measured delivery time.
        buffer = b""
        counted = False
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            arrived = time.time()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not counted and line.startswith(b"event: status"):
                    case.connected += 1
                    counted = True
                elif line.startswith(b'data: {"step"'):
                    sent = json.loads(line[6:])["metrics"]["sent"]
                    case.arrivals.append(arrived - sent)
    finally:
        writer.close()


async def publish(st: Stack, client: httpx.AsyncClient, run_id: str, case: Case, steps: int,
                  hz: float) -> None:  # fmt: skip
    start = time.monotonic()
    for step in range(1, steps + 1):
        await asyncio.sleep(max(0.0, start + step / hz - time.monotonic()))
        body = {"worker_id": "bench", "seq": step, "points": [
            {"step": step, "name": "sent", "value": time.time()}]}  # fmt: skip
        headers = st.lease(run_id)
        t = time.perf_counter()
        r = await client.post(f"/internal/runs/{run_id}/metrics", json=body, headers=headers)
        case.posts.append(time.perf_counter() - t)
        r.raise_for_status()
    case.steps = steps


async def run_case(st: Stack, client: httpx.AsyncClient, case: Case, steps: int) -> Case:
    (run_id,) = await st.running_runs(client, 1, "bench")
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        for i in range(case.subscribers + case.stalled):
            group.create_task(subscriber(st, run_id, case, stop, stalled=i >= case.subscribers))
            if i % 50 == 49:
                await asyncio.sleep(0.05)  # do not SYN-flood the listen backlog
        deadline = time.monotonic() + 120
        # Polled, not an event: the counter is bumped from many tasks, read here only.
        while case.connected < case.subscribers + case.stalled and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await publish(st, client, run_id, case, steps, hz=4.0)
        await asyncio.sleep(2.0)  # the last step's stragglers
        stop.set()
    return case


async def main(quick: bool) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    steps = 20 if quick else 80
    cases = [Case(1), Case(100), Case(500), Case(1000), Case(1000, stalled=10)]
    with stack() as st:
        async with httpx.AsyncClient(base_url=st.base_url, timeout=60) as client:
            for case in cases:
                await run_case(st, client, case, steps)
    rows = []
    for c in cases:
        ms = [x * 1000 for x in c.arrivals]
        expected = c.subscribers * c.steps
        rows.append([
            f"{c.subscribers}" + (f" + {c.stalled} stalled" if c.stalled else ""),
            f"{len(ms)}/{expected}", percentile(ms, 50), percentile(ms, 95), percentile(ms, 99),
            percentile([x * 1000 for x in c.posts], 95),
        ])  # fmt: skip
    print(f"B10 SSE fan-out: {steps} steps at 4 Hz per case; delivery = arrival - send")
    print(table(["subscribers", "delivered", "p50 ms", "p95 ms", "p99 ms", "publish p95 ms"],
                rows))  # fmt: skip
    base95 = percentile([x * 1000 for x in cases[0].arrivals], 95)
    print()
    for c in cases[1:]:
        p95 = percentile([x * 1000 for x in c.arrivals], 95)
        target = TARGETS[c.subscribers]
        complete = len(c.arrivals) == c.subscribers * c.steps
        ok = target is not None and p95 <= target and complete
        extra = f" with {c.stalled} stalled" if c.stalled else ""
        print(f"  {'PASS' if ok else 'MISS'}  {c.subscribers}{extra}: p95 {p95:.1f} ms "
              f"(target {target:.0f}; {p95 / base95:.1f}x one subscriber's {base95:.1f} ms)"
              f"{'' if complete else '; some steps not delivered'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 steps per case (about 1 min)")
    sys.exit(asyncio.run(main(parser.parse_args().quick)))
