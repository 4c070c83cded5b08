"""S1: what the API's proxy adds to a session's chat call, against calling the gateway directly.

    .venv/bin/python bench/s1_session_proxy.py [--calls 300] [--clients 32] [--seconds 10]

A sessions run's calls go client -> API (auth by the run, one database read) -> the
worker's gateway (worker/gateway.py) -> the engine. Here the engine answers at once
(`ScriptedEngine`: a short reply, no model), so what is measured is the HTTP path:
the same gateway called directly (the baseline) and through the API (Postgres and
uvicorn as deployed, bench/b8_stack.py), in one run. Printed: sequential latency
p50/p95 of one client, and calls/s of ``--clients`` concurrent clients.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

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
QUESTION = {"model": "p", "messages": [{"role": "user", "content": "3"}]}


def start_gateway(slots: int) -> tuple[str, threading.Event]:
    """A gateway over a scripted engine on a loop of its own, ``slots`` episodes offered."""
    tok = BuiltinTokenizer()
    engine = ScriptedEngine([[*tok.encode("4"), tok.end_of_turn_id]], stop_ids=[tok.end_of_turn_id])
    broker = SessionBroker(
        engine=engine,
        tokenizer=tok,
        config=SessionConfig(sampling=SamplingParams()),
        group_size=1,
    )
    ready, stop, holder = threading.Event(), threading.Event(), {}

    async def main() -> None:
        async with serve_gateway(broker, token=TOKEN) as url:
            holder["url"] = url
            tasks = [
                asyncio.create_task(broker.play(Trajectory(f"g{i}-e0", group=i), timeout_s=None))
                for i in range(slots)
            ]
            ready.set()
            await asyncio.to_thread(stop.wait)
            for task in tasks:
                task.cancel()

    threading.Thread(target=asyncio.run, args=(main(),), daemon=True).start()
    ready.wait(10)
    return holder["url"], stop


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
    """Each session's calls back to back for ``seconds``; every call's latency."""
    times: list[float] = []
    deadline = time.monotonic() + seconds

    async def client(base: str, key: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=30, headers=headers) as c:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                (await c.post(f"{base}/chat/completions", json=QUESTION)).raise_for_status()
                times.append(time.perf_counter() - t0)

    await asyncio.gather(*(client(b, k) for b, k in sessions))
    return times


async def engine_alone(calls: int) -> list[float]:
    """The baseline below both: the engine's generate itself, no HTTP, no session."""
    tok = BuiltinTokenizer()
    engine = ScriptedEngine([[*tok.encode("4"), tok.end_of_turn_id]], stop_ids=[tok.end_of_turn_id])
    prompt = tok.render_messages(QUESTION["messages"]) + tok.assistant_prefix()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await engine.generate([prompt], max_new_tokens=8, sampling=SamplingParams(), seeds=[0])
        times.append(time.perf_counter() - t0)
    return times


async def run(args: argparse.Namespace) -> None:
    n = args.clients + 1
    url, stop = start_gateway(slots=2 * n)
    try:
        with stack() as s:
            async with httpx.AsyncClient(base_url=s.base_url, timeout=30) as api:
                spec = {"environment": {"name": "sessions"}, "rollout": {"group_size": 1}}
                run_id = (await api.post("/v1/runs", json={"spec": spec}, headers=s.auth)).json()[
                    "id"
                ]
                for action, body in (("claim", {}), ("gateway", {"url": url, "token": TOKEN})):
                    r = await api.post(
                        f"/internal/runs/{run_id}/{action}",
                        json={"worker_id": "bench", **body},
                        headers=s.worker,
                    )
                    r.raise_for_status()
            direct = await open_sessions(f"{url}/v1/sessions", TOKEN, n)
            proxied = await open_sessions(f"{s.base_url}/v1/runs/{run_id}/sessions", s.api_key, n)
            alone = await engine_alone(args.calls)
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
        stop.set()


def ms(times: list[float], q: float) -> float:
    return percentile(times, q) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
