"""B13: the worker's cost of one environment webhook call, httpx (baseline) vs aiohttp.

    .venv/bin/python bench/b13_webhook_call.py [--quick] [--clients httpx,aiohttp,...]
        [--sleeps-ms 0,50] [--concurrency 64,256] [--steps 8]

A real environment server in its own process: `sdk.envserver.EnvServer`
(signature check, idempotency, protocol validation) under uvicorn on
loopback, over an environment whose every step sleeps S ms. This process
runs C concurrent episodes (reset, ``--steps`` steps, close, again) through
`WebhookEnvironment` with ``max_concurrency = C``, once per HTTP client:

- ``httpx``: the client `WebhookEnvironment` used before B13 (httpx 0.28 on
  httpcore 1.0.9, configured as it was), behind the `Transport` seam;
- ``httpx+sniffio``: the same, with a stub ``sniffio`` module in
  ``sys.modules`` for the phase. httpcore 1.0.9 runs ``import sniffio`` each
  time it sets up a lock (several per request); anyio 4.16 no longer installs
  sniffio, so in this project's environment every one of those imports fails
  after searching ``sys.path``. This row separates that cost from httpcore's
  pool, which scans every connection for every queued request (httpcore#1035);
- ``aiohttp``: `rl_core.envs.transport.AiohttpTransport`, the default now;
- ``bare``: a floor, not a client: keep-alive sockets that write the request
  and read a Content-Length answer by hand (no TLS, no chunked bodies).

For each S and C, the clients run back to back (after a warm-up) and each
line prints: calls (resets + steps + closes) and calls/s, the step's wall
latency (mean, p50, p95, ms), its overhead over S, and this process's CPU
time per call (``time.process_time`` over the window / calls, ms), the figure
that matters: the worker's event loop pays it for every call. The last
column is CPU per call against httpx's. The server's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import multiprocessing
import socket
import statistics
import sys
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import free_port, percentile, table
from rl_core.envs.base import Action, Reset, Step
from rl_core.envs.transport import AiohttpTransport, Answer, TransportError, tls_context
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import WebhookCallSpec

SECRET = "bench-secret-0123456789"


# --- the environment server (child process) ---------------------------------------


class SleepEnv:
    """Each step sleeps ``config["sleep_ms"]`` and answers one short message."""

    def __init__(self) -> None:
        self.sleep_s: dict[str, float] = {}

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        self.sleep_s[episode_id] = float(config.get("sleep_ms", 0)) / 1000
        return Reset(messages=[{"role": "user", "content": f"episode {seed}"}])

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        delay = self.sleep_s.get(episode_id, 0.0)
        if delay:
            await asyncio.sleep(delay)
        return Step(messages=[{"role": "user", "content": f"step {step}"}], reward=0.0, done=False)

    async def close(self, episode_id: str) -> None:
        self.sleep_s.pop(episode_id, None)


def _serve(port: int) -> None:
    import uvicorn

    from sdk.envserver import EnvServer

    app = EnvServer(SleepEnv(), secret=SECRET).app
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


@contextlib.contextmanager
def env_server() -> Iterator[str]:
    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or not proc.is_alive():
                raise RuntimeError("the environment server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.join(10)


# --- the clients ----------------------------------------------------------------------


class HttpxTransport:
    """The client `WebhookEnvironment` had before B13, as it was configured."""

    def __init__(self, max_connections: int) -> None:
        self._client = httpx.AsyncClient(
            verify=tls_context(),
            trust_env=False,
            follow_redirects=False,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        try:
            r = await self._client.post(url, content=body, headers=headers, timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise TimeoutError(str(exc)) from exc
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return Answer(r.status_code, r.reason_phrase, r.headers, r.content)

    async def aclose(self) -> None:
        await self._client.aclose()


class BareTransport:
    """A floor: HTTP/1.1 by hand on pooled keep-alive sockets, Content-Length answers only."""

    def __init__(self, max_connections: int) -> None:
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Answer:
        parts = urlsplit(url)
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{lines}"
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        async with asyncio.timeout(timeout_s):
            raw = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = raw.decode("latin-1").split("\r\n")
            fields = dict(h.split(": ", 1) for h in header_lines if h)
            got = {k.lower(): v for k, v in fields.items()}
            content = await reader.readexactly(int(got["content-length"]))
        self._idle.append((reader, writer))
        _, status, reason = status_line.split(" ", 2)
        return Answer(int(status), reason, got, content)

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class HttpxSniffioTransport(HttpxTransport):
    """`HttpxTransport` with ``import sniffio`` answered from ``sys.modules`` (a stub that
    says "asyncio", as sniffio would here) while it lives; a no-op where sniffio is installed."""

    def __init__(self, max_connections: int) -> None:
        super().__init__(max_connections)
        self._stubbed = "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None
        if self._stubbed:
            stub = types.ModuleType("sniffio")
            stub.current_async_library = lambda: "asyncio"  # type: ignore[attr-defined]
            sys.modules["sniffio"] = stub

    async def aclose(self) -> None:
        await super().aclose()
        if self._stubbed:
            del sys.modules["sniffio"]


CLIENTS: dict[str, Any] = {
    "httpx": HttpxTransport,
    "httpx+sniffio": HttpxSniffioTransport,
    # The server is on loopback; the transport checks each connection's address, as the
    # worker's does.
    "aiohttp": functools.partial(
        AiohttpTransport, allowlist=Allowlist.parse("loopback", embedded=False)
    ),
    "bare": BareTransport,
}


# --- one phase ------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    client: str
    sleep_ms: float
    concurrency: int
    window_s: float
    calls: int
    cpu_s: float
    step_latencies: list[float]

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000 * self.cpu_s / self.calls if self.calls else float("nan")


async def phase(
    url: str, client: str, sleep_ms: float, concurrency: int, steps: int, warmup_s: float,
    window_s: float,
) -> Result:  # fmt: skip
    target = WebhookTarget(
        id="env_b13", url=url, secret=SECRET, timeout_s=30.0, max_concurrency=concurrency
    )
    env = WebhookEnvironment(target, policy=WebhookCallSpec(retries=0), transport=CLIENTS[client])
    config = {"sleep_ms": sleep_ms}
    measuring = False
    calls = 0
    latencies: list[float] = []

    async def episodes(worker: int) -> None:
        nonlocal calls
        for n in itertools.count():
            episode_id = f"{client}-{concurrency}-{worker}-{n}"
            await env.reset(episode_id, n, config)
            calls += measuring
            for i in range(1, steps + 1):
                t = time.perf_counter()
                await env.step(episode_id, i, Action(content="x"))
                if measuring:
                    latencies.append(time.perf_counter() - t)
                    calls += 1
            await env.close(episode_id)
            calls += measuring

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(episodes(k)) for k in range(concurrency)]
        await asyncio.sleep(warmup_s)
        measuring = True
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(window_s)
        cpu1, t1 = time.process_time(), time.perf_counter()
        measuring = False
        counted = calls
        for task in tasks:  # calls still in flight are dropped, not waited for
            task.cancel()
    await env.aclose()
    return Result(client, sleep_ms, concurrency, t1 - t0, counted, cpu1 - cpu0, latencies)


def rows(results: list[Result]) -> list[list[Any]]:
    base = {(r.sleep_ms, r.concurrency): r for r in results if r.client == "httpx"}
    out: list[list[Any]] = []
    for r in results:
        lat = [1000 * x for x in r.step_latencies]
        mean = statistics.fmean(lat) if lat else float("nan")
        ref = base.get((r.sleep_ms, r.concurrency))
        vs = f"{r.cpu_ms_per_call / ref.cpu_ms_per_call:.2f}x" if ref else "-"
        out.append([
            f"{r.sleep_ms:g}", r.concurrency, r.client, r.calls, r.calls / r.window_s,
            mean, percentile(lat, 50), percentile(lat, 95), mean - r.sleep_ms,
            f"{r.cpu_ms_per_call:.3f}", vs,
        ])  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s windows (about a minute)")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--sleeps-ms", default="0,50", help="the server's sleep per step")
    parser.add_argument("--concurrency", default="64,256", help="episodes in flight")
    parser.add_argument("--steps", type=int, default=8, help="steps per episode")
    args = parser.parse_args()
    clients = args.clients.split(",")
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        parser.error(f"unknown clients {sorted(unknown)}; choose from {sorted(CLIENTS)}")
    window_s, warmup_s = (3.0, 1.0) if args.quick else (5.0, 1.5)
    results: list[Result] = []
    with env_server() as url:
        for sleep_ms in [float(s) for s in args.sleeps_ms.split(",")]:
            for c in [int(c) for c in args.concurrency.split(",")]:
                for client in clients:
                    result = asyncio.run(
                        phase(url, client, sleep_ms, c, args.steps, warmup_s, window_s)
                    )
                    results.append(result)
                    print(
                        f"  S={sleep_ms:g} ms C={c} {client}: {result.calls} calls, "
                        f"{result.cpu_ms_per_call:.3f} ms CPU/call",
                        flush=True,
                    )
    headers = [
        "S ms", "C", "client", "calls", "calls/s", "step mean ms", "p50", "p95",
        "overhead ms", "CPU ms/call", "CPU vs httpx",
    ]  # fmt: skip
    print(table(headers, rows(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
