"""S1: what the API's proxy adds to a session's chat call, against calling the gateway directly.

    .venv/bin/python bench/s1_session_proxy.py [--calls 300] [--clients 64] [--seconds 10]
        [--engine-ms 0]

A sessions run's calls go client -> API (auth by the run, one database read) -> the
worker's gateway (worker/gateway.py) -> the engine. Here the engine answers at once
(`ScriptedEngine`: a short reply, no model; ``--engine-ms`` makes each call take that
long, as a model's would), so what is measured is the HTTP path:
the same gateway called directly (the baseline) and through the API (Postgres and
uvicorn as deployed, bench/b8_stack.py), in one run; the gateway, the API and the
clients each in a process of their own. Printed: latency p50/p99 of one client's calls
in sequence and of ``--clients`` sessions calling at once, and calls/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.queues
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.b8_stack import percentile, stack, table
from rl_core.agent.ledger import Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.broker import SessionBroker
from rl_core.sessions.session import SessionConfig
from worker.gateway import serve_gateway

TOKEN = "s1-gateway-token-0123456789"
QUESTION: dict[str, Any] = {"model": "p", "messages": [{"role": "user", "content": "3"}]}


def start_gateway(slots: int, engine_s: float) -> tuple[str, Callable[[], None]]:
    """A gateway over a scripted engine in a process of its own (as a worker's is, apart
    from the clients and the API), ``slots`` episodes offered; its URL and a stopper."""
    context = multiprocessing.get_context("spawn")
    urls: multiprocessing.queues.Queue[str] = context.Queue()
    process = context.Process(target=_serve_gateway, args=(slots, engine_s, urls), daemon=True)
    process.start()
    return urls.get(timeout=60), process.terminate


def _serve_gateway(slots: int, engine_s: float, urls: multiprocessing.queues.Queue[str]) -> None:
    tok = BuiltinTokenizer()
    reply = [*tok.encode("4"), tok.end_of_turn_id]
    engine = ScriptedEngine([reply], stop_ids=[tok.end_of_turn_id], delay_s=engine_s)
    broker = SessionBroker(
        engine=engine,
        tokenizer=tok,
        config=SessionConfig(sampling=SamplingParams()),
        group_size=1,
    )

    async def main() -> None:
        async with serve_gateway(broker, token=TOKEN) as url:
            tasks = [
                asyncio.create_task(broker.play(Trajectory(f"g{i}-e0", group=i), timeout_s=None))
                for i in range(slots)
            ]
            urls.put(url)
            await asyncio.gather(*tasks)

    asyncio.run(main())


async def open_sessions(opener: str, auth: str, n: int) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(timeout=30) as client:
        out = []
        for _ in range(n):
            r = await client.post(opener, json={}, headers={"Authorization": f"Bearer {auth}"})
            r.raise_for_status()
            out.append((r.json()["base_url"], r.json()["api_key"]))
        return out


async def sequential(session: tuple[str, str], calls: int) -> list[float]:
    base, key = session
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            (await c.post(f"{base}/chat/completions", json=QUESTION)).raise_for_status()
            times.append(time.perf_counter() - t0)
        return times


async def concurrent(sessions: list[tuple[str, str]], seconds: float) -> list[float]:
    """Each session's calls back to back for ``seconds``; every call's latency. The
    clients are aiohttp (a fraction of httpx's CPU per call) sharing one pool."""
    times: list[float] = []
    deadline = time.monotonic() + seconds
    body = json.dumps(QUESTION).encode()

    async def client(http: aiohttp.ClientSession, base: str, key: str) -> None:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            async with http.post(f"{base}/chat/completions", data=body, headers=headers) as r:
                r.raise_for_status()
                await r.read()
            times.append(time.perf_counter() - t0)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(client(http, b, k) for b, k in sessions))
    return times


async def engine_alone(calls: int, engine_s: float) -> list[float]:
    """The baseline below both: the engine's generate itself, no HTTP, no session."""
    tok = BuiltinTokenizer()
    engine = ScriptedEngine(
        [[*tok.encode("4"), tok.end_of_turn_id]], stop_ids=[tok.end_of_turn_id], delay_s=engine_s
    )
    prompt = tok.render_messages(QUESTION["messages"]) + tok.assistant_prefix()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await engine.generate([prompt], max_new_tokens=8, sampling=SamplingParams(), seeds=[0])
        times.append(time.perf_counter() - t0)
    return times


async def run(args: argparse.Namespace) -> None:
    n = args.clients + 1
    url, stop = start_gateway(slots=2 * n, engine_s=args.engine_ms / 1e3)
    try:
        with stack() as s:
            async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as api:
                spec = {"environment": {"name": "sessions"}, "rollout": {"group_size": 1}}
                run_id = (await api.post("/v1/runs", json={"spec": spec}, headers=s.auth)).json()[
                    "id"
                ]
                claimed = await api.post(
                    f"/internal/runs/{run_id}/claim", json={"worker_id": "bench"}, headers=s.worker
                )
                claimed.raise_for_status()
                s.leases[run_id] = claimed.json()["lease_token"]
                r = await api.post(
                    f"/internal/runs/{run_id}/gateway",
                    json={"worker_id": "bench", "url": url, "token": TOKEN},
                    headers=s.lease(run_id),
                )
                r.raise_for_status()
            direct = await open_sessions(f"{url}/v1/sessions", TOKEN, n)
            proxied = await open_sessions(f"{s.base_url}/v1/runs/{run_id}/sessions", s.api_key, n)
            alone = await engine_alone(args.calls, args.engine_ms / 1e3)
            rows: list[tuple[object, ...]] = [
                ("the engine alone", 1, ms(alone, 50), ms(alone, 99), ""),
            ]
            for name, sessions in (("direct to the gateway", direct), ("through the API", proxied)):
                one = await sequential(sessions[0], args.calls)
                many = await concurrent(sessions[1:], args.seconds)
                rows.append((name, 1, ms(one, 50), ms(one, 99), f"{len(one) / sum(one):.0f}"))
                rate = f"{len(many) / args.seconds:.0f}"
                rows.append((name, args.clients, ms(many, 50), ms(many, 99), rate))
            print(table(("path", "sessions", "p50 ms", "p99 ms", "calls/s"), rows))
    finally:
        stop()


def ms(times: list[float], q: float) -> float:
    return percentile(times, q) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--engine-ms", type=float, default=0.0, help="each call's engine time (0: at once)"
    )
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
