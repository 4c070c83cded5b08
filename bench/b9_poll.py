"""B9: status-poll latency while a run and its ingest keep the server busy.

    .venv/bin/python bench/b9_poll.py [--quick] [--ingest-rate POINTS_PER_S]

Pollers (``GET /v1/runs/{id}`` at a fixed rate each, as a dashboard or the
SDK's ``runs watch`` does) against one uvicorn + Postgres:

- baseline: the same pollers on an idle server;
- candidate: the same pollers while another process posts metric batches
  (B8's open loop) and a live metrics stream is open on the run.

The ingest load runs in its own process so its JSON encoding does not delay
the pollers' own event loop. Each poller holds one keep-alive connection over a
bare socket (see ``Connection``). Targets: p50 <= 5 ms, p99 <= 50 ms under load.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import Stack, percentile, sleep_until, stack, table


class Connection:
    """One keep-alive HTTP/1.1 connection over a bare asyncio stream.

    An HTTP client library adds ~0.7 ms of its own per request on this machine
    (httpx: pool, models, cookies); the latency measured here is the server's.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, base_url: str) -> Connection:
        url = urlsplit(base_url)
        return cls(*await asyncio.open_connection(url.hostname, url.port))

    async def get(self, path: str, headers: dict[str, str]) -> int:
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n{lines}\r\n".encode())
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await self._reader.readexactly(length)
        return status

    def close(self) -> None:
        self._writer.close()


async def poll(st: Stack, run_id: str, pollers: int, hz: float, duration: float) -> list[float]:
    latencies: list[float] = []

    async def poller(offset: float) -> None:
        conn = await Connection.open(st.base_url)
        try:
            start = time.monotonic() + offset
            for i in range(int(duration * hz)):
                await sleep_until(start + i / hz)
                t = time.perf_counter()
                status = await conn.get(f"/v1/runs/{run_id}", st.auth)
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    raise RuntimeError(f"poll answered {status}")
        finally:
            conn.close()

    async with asyncio.TaskGroup() as group:
        for k in range(pollers):
            group.create_task(poller(k / (pollers * hz)))
    return latencies


async def _ingest(st: Stack, run_ids: list[str], rate: float, duration: float) -> None:
    from bench.b8_ingest import NAMES, Runs, open_loop

    runs = Runs(run_ids, steps_per_batch=50)
    async with httpx.AsyncClient(base_url=st.base_url, timeout=60) as client:
        await open_loop(client, st, runs, "load", rate, duration, 50 * len(NAMES))


def ingest_process(st: Stack, run_ids: list[str], rate: float, duration: float) -> None:
    asyncio.run(_ingest(st, run_ids, rate, duration))


async def stream_reader(st: Stack, run_id: str, stop: asyncio.Event) -> int:
    """A dashboard's live stream on the busy run, read as fast as it comes."""
    events = 0
    async with (
        httpx.AsyncClient(base_url=st.base_url, timeout=None) as client,
        client.stream("GET", f"/v1/runs/{run_id}/metrics/stream", headers=st.auth) as response,
    ):
        async for line in response.aiter_lines():
            events += line.startswith("id: ")
            if stop.is_set():
                break
    return events


async def main(quick: bool, ingest_rate: float) -> int:
    duration = 8.0 if quick else 30.0
    pollers, hz = 10, 10.0
    with stack() as st:
        async with httpx.AsyncClient(base_url=st.base_url, timeout=30) as client:
            run_ids = await st.running_runs(client, 4, "bench")
        watched = run_ids[0]
        await poll(st, watched, pollers, hz, 1.0)  # warm-up
        idle = await poll(st, watched, pollers, hz, duration)
        loader = multiprocessing.get_context("spawn").Process(
            target=ingest_process, args=(st, run_ids, ingest_rate, duration + 2)
        )
        loader.start()
        stop = asyncio.Event()
        reader = asyncio.create_task(stream_reader(st, watched, stop))
        await asyncio.sleep(1.0)  # the load reaches its rate
        busy = await poll(st, watched, pollers, hz, duration)
        stop.set()
        loader.join(120)
        streamed = await asyncio.wait_for(reader, 60)
    rows = []
    for name, lat in (("baseline: idle server", idle), ("candidate: ingest busy", busy)):
        ms = [x * 1000 for x in lat]
        rows.append([name, len(ms), percentile(ms, 50), percentile(ms, 95), percentile(ms, 99)])
    print(f"B9 status poll: {pollers} pollers x {hz:.0f} Hz, {duration:.0f} s; load: "
          f"{ingest_rate:,.0f} points/s from another process + one live stream "
          f"({streamed} step events read)")  # fmt: skip
    print(table(["phase", "polls", "p50 ms", "p95 ms", "p99 ms"], rows))
    b50, b99 = percentile(busy, 50) * 1000, percentile(busy, 99) * 1000
    i50, i99 = percentile(idle, 50) * 1000, percentile(idle, 99) * 1000
    print(f"\nbusy / idle: p50 {b50 / i50:.2f}x, p99 {b99 / i99:.2f}x")
    print(f"  {'PASS' if b50 <= 5 else 'MISS'}  p50 <= 5 ms under load ({b50:.1f} ms)")
    print(f"  {'PASS' if b99 <= 50 else 'MISS'}  p99 <= 50 ms under load ({b99:.1f} ms)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 s phases (under a minute)")
    parser.add_argument("--ingest-rate", type=float, default=10_000, help="points/s of load")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.quick, args.ingest_rate)))
