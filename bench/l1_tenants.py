"""L1: the service loaded by many tenants, with a worker killed and Postgres restarted.

    .venv/bin/python bench/l1_tenants.py [--tenants 50] [--minutes 20] [--heavy 0.1]
        [--sessions 0.2] [--no-faults]
    .venv/bin/python bench/l1_tenants.py --ramp [--steps 10,25,50,100,150] [--step-minutes 3]

The whole stack as an operator starts it: PostgreSQL and Redis (``scripts/services.sh``),
``rlaas migrate``, a tenant and API key per simulated tenant, two worker credentials
(``rlaas workers issue``, no shared token), two API processes (``rlaas serve``) on the
one database and broker, and two ``rlaas worker`` processes, one credential each.

Each tenant is a coroutine with its own key (asyncio + httpx; its requests go to the two
API processes in turn): it submits a tiny run (``builtin:tiny`` on guess_number, a few
steps), follows it on the live metrics stream (SSE, ``/v1/runs/{id}/metrics/stream``)
and by polling ``/v1/runs/{id}``, and when it ends reads its events and metrics, waits
``--think-s`` and submits the next. A ``--heavy`` share of tenants keeps up to
``--heavy-outstanding`` runs unfinished (the tenants a fair claim must not let starve the
others); a ``--sessions`` share submits sessions runs and plays them through the
session URL (open, two chat calls, end with a reward), as an agent would.

Faults (not in ``--ramp``; off with ``--no-faults``): at 35 % of the time, once it holds a
running run, worker-1 is SIGKILLed and started again 5 s later; at 60 % Postgres is
stopped and started again (``scripts/services.sh pg-stop`` / ``pg-start``).

At the end, with every unfinished run waited for (``--drain-minutes``) then counted:

- nothing lost or doubled: each submitted run reached a terminal state, each run's
  steps 1..N are in its metrics exactly once, every run the server lists was submitted;
- fairness: time from submit to first claim per tenant (max/p50/p99), checked against
  the bound the claim rule gives (below, `fairness_bound`);
- per route (client-measured, grouped by route template): count, p50, p99, 5xx.

``--ramp``: no faults; tenants are added in steps (``--steps``) of ``--step-minutes``
each, and the step where the p99 of some route passes 1 s (routes with 100 calls or
more in the step; not a model call or a session's open, see NOT_JUDGED), or the queue of runs grows
without bound (its slope over the step is above 0 beyond its 95 % interval and the
queue at the end is more than the workers can drain in a step), is the breaking point.
Prints a PASS/MISS line per check and exits 1 on a MISS. Not a test: CI does not run it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._deployment import Deployment, rlaas
from bench.b8_stack import REPO, free_port, percentile, table
from bench.soak import slope

SERVICES = str(REPO / "scripts" / "services.sh")
TERMINAL = ("succeeded", "failed", "cancelled")
WORKERS = 2
RESERVOIR = 20_000  # latencies kept per route (reservoir sampling): memory stays bounded

# A run a worker serves in seconds (compile included), so a tenant's turn comes often.
RUN_SPEC: dict[str, Any] = {
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "guess_number", "config": {"low": 1, "high": 4, "max_turns": 2}},
    "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context": 96},
    "rollout": {"group_size": 2, "concurrency": 8},
    "algorithm": {"batch_groups": 2},
    "train": {"steps": 4, "seed": 0},
}
SESSION_SPEC: dict[str, Any] = {
    "model": {"source": "builtin:tiny"},
    "environment": {"name": "sessions"},
    "agent": {"max_new_tokens": 8, "max_context": 96},
    "rollout": {"group_size": 2, "concurrency": 4},
    "algorithm": {"batch_groups": 2},
    "staleness": {"mode": "async", "max_staleness": 1},
    "train": {"steps": 2, "seed": 0},
}
# The reaper's pace as the fault tests set it (operators' defaults are 5 s each): a killed
# worker's run is queued again soon after its lease (60 s, the default) ends.
FAST_REAPER = {"RLAAS_REAPER_INTERVAL_S": "1", "RLAAS_REQUEUE_BACKOFF_S": "1"}
LEASE_S = 60.0
# Routes whose time is not the control plane's: a model call is the worker's engine
# generating, and opening a session holds the call until an episode is free (wait_s).
# A p99 of fewer calls is their maximum: one slow call would be the breaking point.
MIN_JUDGED_CALLS = 100
NOT_JUDGED = ("/chat/completions", "POST /v1/runs/{id}/sessions")


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# ---------------------------------------------------------------- measurements


ID_SEGMENT = re.compile(
    r"^(run|ses|sess|tnt|wcr)_[A-Za-z0-9_~.-]+$|^[0-9a-f-]{16,}$|^[A-Za-z0-9_-]{20,}$"
)


def template(path: str) -> str:
    """A path with its ids replaced, so each route's calls group together."""
    parts = path.split("?", 1)[0].split("/")
    return "/".join("{id}" if ID_SEGMENT.match(p) else p for p in parts)


@dataclasses.dataclass
class Route:
    count: int = 0
    errors_5xx: int = 0
    waits_503: int = 0  # a session route's 503 before the run's gateway serves: by design
    other_errors: int = 0  # transport errors (connection refused while Postgres restarts...)
    kept: list[float] = dataclasses.field(default_factory=list)

    def add(self, seconds: float, rng: random.Random) -> None:
        self.count += 1
        if len(self.kept) < RESERVOIR:
            self.kept.append(seconds)
        else:  # reservoir sampling: every call equally likely to be kept
            k = rng.randrange(self.count)
            if k < RESERVOIR:
                self.kept[k] = seconds


@dataclasses.dataclass
class Stats:
    routes: dict[str, Route] = dataclasses.field(default_factory=lambda: defaultdict(Route))
    step_routes: dict[str, Route] = dataclasses.field(default_factory=lambda: defaultdict(Route))
    rng: random.Random = dataclasses.field(default_factory=lambda: random.Random(0))
    fault_windows: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    # Every 5xx or transport error not by design, with when it came: judged against the
    # fault windows at the report, since a window is known whole only once its fault ends.
    failures: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    stream_events: int = 0
    stream_reconnects: int = 0
    sessions_played: int = 0
    sessions_lost: int = 0
    session_errors: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    submits_refused: int = 0

    def record(self, method: str, path: str, seconds: float, status: int | None) -> None:
        key = f"{method} {template(path)}"
        for routes in (self.routes, self.step_routes):
            route = routes[key]
            route.add(seconds, self.rng)
            if status is None:
                route.other_errors += 1
            elif status == 503 and "/sessions" in path:
                route.waits_503 += 1
            elif status >= 500:
                route.errors_5xx += 1
        failed = status is None or status >= 500
        # A 503 from a session route before the run's gateway serves is by design.
        by_design = status == 503 and "/sessions" in path
        if failed and not by_design:
            self.failures.append((time.time(), f"{status} {method} {path}"))

    @property
    def errors_5xx_outside_faults(self) -> list[str]:
        return [label for at, label in self.failures if not self.in_fault(at)]

    def in_fault(self, at: float, slack_s: float = 90.0) -> bool:
        # A fault's effects last past it: a pool reconnecting, a lease running out.
        return any(a <= at <= b + slack_s for a, b in self.fault_windows)


class Api:
    """Two API processes, used in turn; every call timed and recorded under its route."""

    def __init__(self, urls: list[str], stats: Stats, tenants: int) -> None:
        limits = httpx.Limits(max_connections=4 * tenants + 16, max_keepalive_connections=64)
        self.clients = [httpx.AsyncClient(base_url=u, timeout=60, limits=limits) for u in urls]
        self.turn = itertools.cycle(range(len(urls)))
        self.stats = stats

    async def call(self, method: str, path: str, key: str, **kw: Any) -> httpx.Response | None:
        client = self.clients[next(self.turn)]
        headers = {"Authorization": f"Bearer {key}", **kw.pop("headers", {})}
        start = time.perf_counter()
        try:
            r = await client.request(method, path, headers=headers, **kw)
        except httpx.HTTPError:
            self.stats.record(method, path, time.perf_counter() - start, None)
            return None
        self.stats.record(method, path, time.perf_counter() - start, r.status_code)
        return r

    @contextlib.asynccontextmanager
    async def stream(self, path: str, key: str) -> AsyncIterator[httpx.Response | None]:
        client = self.clients[next(self.turn)]
        start = time.perf_counter()
        try:
            async with client.stream(
                "GET", path, headers={"Authorization": f"Bearer {key}"}, timeout=None
            ) as r:
                # Time to the answer's headers: what a dashboard waits before it shows.
                self.stats.record("GET", path, time.perf_counter() - start, r.status_code)
                yield r
        except httpx.HTTPError:
            self.stats.record("GET", path, time.perf_counter() - start, None)
            yield None

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


# ---------------------------------------------------------------- tenants


@dataclasses.dataclass
class Submitted:
    run_id: str
    tenant: int
    created: float  # server clock
    alone: bool  # the tenant had no other unfinished run when it submitted
    sessions: bool
    final: dict[str, Any] | None = None
    first_claim: float | None = None
    claims: list[float] = dataclasses.field(default_factory=list)
    steps_seen: dict[str, list[int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Tenant:
    index: int
    key: str
    heavy: bool
    sessions: bool
    runs: list[Submitted] = dataclasses.field(default_factory=list)
    unfinished: int = 0


async def sse(api: Api, tenant: Tenant, run_id: str, stats: Stats) -> None:
    """Follow the run's live metrics until its terminal status event (reconnecting)."""
    last: str | None = None
    while True:
        path = f"/v1/runs/{run_id}/metrics/stream" + (f"?after_step={last}" if last else "")
        async with api.stream(path, tenant.key) as r:
            if r is not None and r.status_code == 200:
                with contextlib.suppress(httpx.HTTPError):
                    async for line in r.aiter_lines():
                        if line.startswith("id:"):
                            last = line[3:].strip()
                        elif line.startswith("data:"):
                            stats.stream_events += 1
                            if any(f'"{s}"' in line for s in TERMINAL) and '"step"' not in line:
                                return
        stats.stream_reconnects += 1
        await asyncio.sleep(1.0)


async def play(api: Api, tenant: Tenant, run_id: str, stats: Stats, done: asyncio.Event) -> None:
    """Sessions of a sessions run, as an agent: open, two model calls, end with a reward."""
    episode = 0
    while not done.is_set():
        group = f"task-{episode // 2}"
        episode += 1
        r = await api.call(
            "POST", f"/v1/runs/{run_id}/sessions", tenant.key, json={"group": group, "wait_s": 10}
        )
        if r is None or r.status_code in (429, 503):
            pause = float(r.headers.get("Retry-After", "1")) if r is not None else 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), min(pause, 5.0))
            continue
        if r.status_code != 201:
            stats.session_errors[f"open {r.status_code}"] += 1
            if r.status_code == 409:  # the run has ended
                return
            await asyncio.sleep(1.0)
            continue
        data = r.json()
        base = httpx.URL(data["base_url"]).path
        messages = [{"role": "user", "content": str(episode % 4 + 1)}]
        ok = True
        for _ in range(2):
            a = await api.call(
                "POST",
                f"{base}/chat/completions",
                data["api_key"],
                json={"model": "policy", "messages": messages},
            )
            if a is None or a.status_code != 200:
                ok = False
                code = "transport" if a is None else a.status_code
                stats.session_errors[f"chat {code}"] += 1
                if a is not None and a.status_code == 410 and "session_lost" in a.text:
                    stats.sessions_lost += 1
                break
            content = a.json()["choices"][0]["message"]["content"]
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": "again"},
            ]
        if ok:
            e = await api.call(
                "POST", f"{base}/end", data["api_key"], json={"reward": float(episode % 2)}
            )
            if e is not None and e.status_code == 200:
                stats.sessions_played += 1
            else:
                stats.session_errors[f"end {None if e is None else e.status_code}"] += 1


async def follow(api: Api, tenant: Tenant, sub: Submitted, stats: Stats) -> None:
    """Stream and poll a run until it ends, then read its events and metrics."""
    done = asyncio.Event()
    tasks = [asyncio.create_task(sse(api, tenant, sub.run_id, stats))]
    if sub.sessions:
        tasks += [asyncio.create_task(play(api, tenant, sub.run_id, stats, done)) for _ in range(2)]
    try:
        while True:
            r = await api.call("GET", f"/v1/runs/{sub.run_id}", tenant.key)
            if r is not None and r.status_code == 200 and r.json()["status"] in TERMINAL:
                sub.final = r.json()
                break
            await asyncio.sleep(2.0 + random.random())
    except asyncio.CancelledError:  # the ramp's end: nothing to wait for
        for task in tasks:
            task.cancel()
        raise
    # The stream ends on the run's terminal status, the agents on done (or a 409).
    done.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    for task in tasks:
        task.cancel()
    ev = await retried(api, f"/v1/runs/{sub.run_id}/events", tenant.key)
    sub.claims = [ts(e["created_at"]) for e in ev["items"] if e["to_status"] == "starting"]
    sub.first_claim = min(sub.claims, default=None)
    points = (await retried(api, f"/v1/runs/{sub.run_id}/metrics", tenant.key))["points"]
    steps: dict[str, list[int]] = defaultdict(list)
    for p in points:
        steps[p["name"]].append(p["step"])
    sub.steps_seen = dict(steps)
    tenant.unfinished -= 1


async def retried(api: Api, path: str, key: str) -> dict[str, Any]:
    for _ in range(60):
        r = await api.call("GET", path, key)
        if r is not None and r.status_code == 200:
            out: dict[str, Any] = r.json()
            return out
        await asyncio.sleep(2.0)
    raise RuntimeError(f"GET {path} kept failing")


async def tenant_loop(
    api: Api, tenant: Tenant, stats: Stats, stop: asyncio.Event, args: argparse.Namespace
) -> None:
    """Submit, follow, think, again, until told to stop; then wait for what is unfinished."""
    followers: set[asyncio.Task[None]] = set()
    await asyncio.sleep(random.random() * 5)  # tenants do not all arrive at one instant
    cap = args.heavy_outstanding if tenant.heavy else 1
    while not stop.is_set():
        if tenant.unfinished < cap:
            spec = SESSION_SPEC if tenant.sessions else RUN_SPEC
            alone = tenant.unfinished == 0
            r = await api.call("POST", "/v1/runs", tenant.key, json={"spec": spec})
            if r is not None and r.status_code == 201:
                body = r.json()
                sub = Submitted(
                    body["id"], tenant.index, ts(body["created_at"]), alone, tenant.sessions
                )
                tenant.runs.append(sub)
                tenant.unfinished += 1
                task = asyncio.create_task(follow(api, tenant, sub, stats))
                followers.add(task)
                task.add_done_callback(followers.discard)
                if tenant.unfinished < cap:
                    continue  # a heavy tenant fills its share at once
            elif r is not None and r.status_code == 429:
                stats.submits_refused += 1
        # Think (or wait for a run to end) before the next submit.
        pause = args.think_s * (0.5 + random.random())
        deadline = time.monotonic() + pause
        while not stop.is_set() and (time.monotonic() < deadline or tenant.unfinished >= cap):
            with contextlib.suppress(TimeoutError):  # polls its own counter, woken by stop
                await asyncio.wait_for(stop.wait(), 0.5)
    if followers:
        await asyncio.wait(followers, timeout=60 * args.drain_minutes)
        for task in followers:
            task.cancel()


# ---------------------------------------------------------------- the deployment


@dataclasses.dataclass
class Stack:
    dep: Deployment
    folder: str
    api_urls: list[str]
    keys: list[str]

    def restart_worker(self, name: str) -> None:
        self.dep.procs[name].wait()
        self.dep.start(name, rlaas("worker", "--loglevel", "WARNING"), self.worker_env[name])

    worker_env: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


def create_tenants(env: dict[str, str], n: int) -> list[str]:
    """N tenants in one process (``rlaas tenants create`` is a Python start-up each)."""
    code = (
        "import asyncio, sys\n"
        "from app.admin import create_tenant\n"
        "from app.settings import Settings\n"
        "async def main():\n"
        "    s = Settings()\n"
        f"    for i in range({n}):\n"
        "        print((await create_tenant(s, f'load-{i:03d}'))[1])\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"creating tenants failed:\n{done.stderr}")
    keys = done.stdout.split()
    assert len(keys) == n, done.stdout
    return keys


@contextlib.contextmanager
def stack(tenants: int) -> Iterator[Stack]:
    folder = tempfile.mkdtemp(prefix="rlaas-l1-", dir="/tmp")  # reachable by `postgres`
    logs = Path(folder) / "logs"
    logs.mkdir()
    dep: Deployment | None = None
    try:
        subprocess.run([SERVICES, "start", folder], check=True, capture_output=True)
        lines = (Path(folder) / "env").read_text().splitlines()
        urls = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        ports = [free_port(), free_port()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLAAS_")}
        env.update(
            {
                "RLAAS_DATABASE_URL": urls["RLAAS_TEST_DATABASE_URL"],
                "RLAAS_BROKER_URL": urls["RLAAS_TEST_REDIS_URL"],
                "RLAAS_SECRET_KEY": secrets.token_urlsafe(32),
                "RLAAS_DATA_DIR": str(Path(folder) / "data"),
                "RLAAS_API_URL": f"http://127.0.0.1:{ports[0]}",
                "PYTHONUNBUFFERED": "1",
                **FAST_REAPER,
            }
        )
        dep = Deployment(env=env, logs=logs)
        done = subprocess.run(rlaas("migrate"), env=env, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"rlaas migrate failed:\n{done.stderr}")
        keys = create_tenants(env, tenants)
        api_urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, port in enumerate(ports, 1):
            dep.start(f"api-{i}", rlaas("serve", "--port", str(port)))
        for i, url in enumerate(api_urls, 1):
            dep.wait_ready(f"api-{i}", f"{url}/readyz")
        st = Stack(dep=dep, folder=folder, api_urls=api_urls, keys=keys)
        for i in range(1, WORKERS + 1):
            name = f"worker-{i}"
            issued = subprocess.run(
                rlaas("workers", "issue", name), env=env, cwd=REPO, capture_output=True, text=True
            )
            if issued.returncode:
                raise RuntimeError(f"rlaas workers issue failed:\n{issued.stderr}")
            st.worker_env[name] = {
                "RLAAS_WORKER_CREDENTIAL": issued.stdout.strip().splitlines()[-1],
                "RLAAS_API_URL": api_urls[(i - 1) % len(api_urls)],  # one worker per API
            }
            dep.start(name, rlaas("worker", "--loglevel", "WARNING"), st.worker_env[name])
        yield st
    except BaseException:
        if dep is not None:
            print(dep.tails(), file=sys.stderr)
        raise
    finally:
        if dep is not None:
            dep.stop()
        subprocess.run([SERVICES, "stop", folder], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def queued_now(database_url: str) -> int | None:
    conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute("SELECT count(*) FROM runs WHERE status = 'queued'").fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row else 0


def running_on(database_url: str, worker: str) -> bool:
    """Whether the worker enrolled as ``worker`` holds a running run now."""
    conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
    with contextlib.suppress(psycopg.Error), psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs r JOIN worker_credentials w "
            "ON w.id = r.lease_credential_id WHERE w.name = %s AND r.status = 'running'",
            (worker,),
        ).fetchone()
        return bool(row and row[0])
    return False


def server_runs(database_url: str) -> list[tuple[str, str]]:
    conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [(str(a), str(b)) for a, b in conn.execute("SELECT id, status FROM runs")]


async def faults(st: Stack, stats: Stats, total_s: float, t0: float) -> None:
    """A worker SIGKILLed (and started again) at 35 % of the time; Postgres restarted at 60 %."""
    await asyncio.sleep(max(0.0, t0 + 0.35 * total_s - time.monotonic()))
    # Mid-run: wait (up to a minute) until worker-1 holds a running run.
    for _ in range(60):
        if await asyncio.to_thread(running_on, st.dep.env["RLAAS_DATABASE_URL"], "worker-1"):
            break
        await asyncio.sleep(1)
    begin = time.time()
    st.dep.procs["worker-1"].send_signal(signal.SIGKILL)
    print(f"  fault: worker-1 SIGKILLed at t={time.monotonic() - t0:.0f}s", flush=True)
    await asyncio.sleep(5)
    await asyncio.to_thread(st.restart_worker, "worker-1")
    stats.fault_windows.append((begin, time.time() + LEASE_S))  # its run waits out the lease
    await asyncio.sleep(max(0.0, t0 + 0.60 * total_s - time.monotonic()))
    begin = time.time()
    print(f"  fault: Postgres stopped at t={time.monotonic() - t0:.0f}s", flush=True)
    await asyncio.to_thread(
        subprocess.run, [SERVICES, "pg-stop", st.folder], check=True, capture_output=True
    )
    await asyncio.sleep(3)
    await asyncio.to_thread(
        subprocess.run, [SERVICES, "pg-start", st.folder], check=True, capture_output=True
    )
    stats.fault_windows.append((begin, time.time()))
    print(f"  fault: Postgres back after {time.time() - begin:.1f}s", flush=True)


# ---------------------------------------------------------------- checks and report


def route_table(routes: dict[str, Route]) -> str:
    rows = []
    for key in sorted(routes, key=lambda k: -routes[k].count):
        r = routes[key]
        rows.append(
            [
                key,
                r.count,
                f"{1e3 * percentile(r.kept, 50):.1f}",
                f"{1e3 * percentile(r.kept, 99):.1f}",
                r.errors_5xx,
                r.waits_503,
                r.other_errors,
            ]
        )
    headers = ["route", "calls", "p50 ms", "p99 ms", "5xx", "503 not serving yet", "transport"]
    return table(headers, rows)


def service_times(subs: list[Submitted]) -> list[float]:
    """Seconds from each ended run's last claim to its end: one attempt's service."""
    return [
        ts(s.final["finished_at"]) - s.claims[-1]
        for s in subs
        if s.final is not None and s.final.get("finished_at") and s.claims
    ]


def check(ok: bool, what: str) -> bool:
    print(f"{'PASS' if ok else 'MISS'}  {what}")
    return ok


def fairness_bound(tenants: int, s_max: float, fault_s: float) -> float:
    """The longest wait the claim rule allows a run whose tenant had nothing else unfinished.

    app/services/fair.py orders queued runs by (1) the tenant's runs starting or running,
    fewest first, (2) the tenant's last claim, oldest first. Such a run's tenant has 0
    active runs, so only tenants with 0 active go before it, and of those only ones
    whose last claim is older than its tenant's; once claimed, a tenant has 1 active and
    the newest last claim, so it goes behind our run until our run is claimed, even if
    it has more queued (and when that run ends its last claim is still newer than our
    tenant's). So at most ``tenants - 1`` claims (one per other tenant) come before it,
    whatever the others' queues hold, plus ``W - 1`` claims that read the same snapshot
    as another (fair.py's fairness error of one run per concurrent claim). With W
    workers each finishing a run within ``s_max``, those claims and its own happen
    within ``(ceil((tenants - 1 + W - 1) / W) + 1) * s_max``, plus the time the faults
    took workers away.
    """
    ahead = tenants - 1 + WORKERS - 1
    return (math.ceil(ahead / WORKERS) + 1) * s_max + fault_s


def report(tenants: list[Tenant], stats: Stats, st: Stack, fault_s: float) -> bool:
    subs = [s for t in tenants for s in t.runs]
    print("\nPer route (client-measured, both API processes):")
    print(route_table(stats.routes))
    ok = True
    # -- nothing lost or doubled
    unfinished = [s.run_id for s in subs if s.final is None]
    counts: dict[str, int] = defaultdict(int)
    for s in subs:
        if s.final is not None:
            counts[s.final["status"]] += 1
    print(
        f"\n{len(subs)} runs submitted by {len(tenants)} tenants: "
        f"{dict(counts)}; unfinished {len(unfinished)}; claimed more than once (a fault "
        f"took their worker) {sum(bool(s.final and s.final['attempts'] > 1) for s in subs)}"
    )
    ok &= check(
        not unfinished,
        f"every run reached a terminal state ({len(unfinished)} not: {unfinished[:5]})",
    )
    ok &= check(
        not counts.get("failed"),
        f"no run failed ({counts.get('failed', 0)}: "
        + "; ".join(
            f"{s.run_id}: {s.final['error']}"
            for s in subs
            if s.final and s.final["status"] == "failed"
        )[:600]
        + ")",
    )
    if fault_s:
        again = [s.run_id for s in subs if s.final and s.final["attempts"] > 1]
        ok &= check(
            bool(again),
            f"the SIGKILL took a run mid-way and it was claimed again ({len(again)} runs "
            "claimed more than once; each is in the checks above)",
        )
    bad_steps = []
    for s in subs:
        if s.final is None or s.final["status"] != "succeeded":
            continue
        n = s.final["current_step"]
        for name, steps in s.steps_seen.items():
            if len(steps) != len(set(steps)):
                bad_steps.append(f"{s.run_id} {name}: doubled steps")
        # Every step's training metric is there exactly once (other names may be sparse).
        loss = sorted(s.steps_seen.get("loss", []))
        if loss != list(range(1, n + 1)):
            bad_steps.append(f"{s.run_id} loss steps {loss[:3]}..{loss[-3:]} for {n} steps")
    ok &= check(
        not bad_steps,
        f"each succeeded run's steps 1..N are in its metrics exactly once "
        f"({len(bad_steps)} not: {bad_steps[:3]})",
    )
    listed = server_runs(st.dep.env["RLAAS_DATABASE_URL"])
    ours = {s.run_id for s in subs}
    strays = [r for r, _ in listed if r not in ours]
    missing = ours - {r for r, _ in listed}
    ok &= check(
        not strays and not missing,
        f"every run the server holds was submitted, and "
        f"every submitted run is held ({len(strays)} strays, {len(missing)} missing)",
    )
    # -- fairness
    waits: dict[int, list[float]] = defaultdict(list)
    bounded: list[tuple[float, Submitted]] = []
    service = service_times(subs)
    s_max = max(service, default=math.nan)
    for s in subs:
        if s.first_claim is not None:
            waits[s.tenant].append(s.first_claim - s.created)
            if s.alone:
                bounded.append((s.first_claim - s.created, s))
    bound = fairness_bound(len(tenants), s_max, fault_s)
    all_waits = [w for ws in waits.values() for w in ws]
    print(
        f"\nService time (last claim to end): mean "
        f"{statistics.fmean(service or [math.nan]):.1f} s, "
        f"max {s_max:.1f} s over {len(service)} runs; workers {WORKERS}, tenants {len(tenants)}"
    )
    rows = []
    for t in tenants:
        ws = waits.get(t.index, [])
        kind = ("heavy" if t.heavy else "light") + (", sessions" if t.sessions else "")
        rows.append(
            [
                f"load-{t.index:03d}",
                kind,
                len(t.runs),
                f"{max(ws, default=math.nan):.1f}",
                f"{percentile(ws, 50):.1f}",
                f"{percentile(ws, 99):.1f}",
            ]
        )
    print("Time from submit to first claim, per tenant (s):")
    print(table(["tenant", "kind", "runs", "max", "p50", "p99"], rows))
    print(
        f"all tenants: max {max(all_waits, default=math.nan):.1f} s, p50 "
        f"{percentile(all_waits, 50):.1f} s, p99 {percentile(all_waits, 99):.1f} s"
    )
    worst = max(bounded, key=lambda x: x[0], default=None)
    print(
        f"bound for a run whose tenant had nothing else unfinished: (ceil((T-1 + W-1)/W) + 1) "
        f"x S_max + F = (ceil({len(tenants) - 1 + WORKERS - 1}/{WORKERS}) + 1) x {s_max:.1f} s "
        f"+ {fault_s:.0f} s = {bound:.1f} s"
    )
    over = [(w, s.run_id) for w, s in bounded if w > bound]
    ok &= check(
        bool(bounded) and not over,
        f"every such run ({len(bounded)}) was claimed within "
        f"the bound (worst {worst[0] if worst else math.nan:.1f} s; over: {over[:3]})",
    )
    # -- errors
    print(
        f"\nstreams: {stats.stream_events} events, {stats.stream_reconnects} reconnects; "
        f"sessions played {stats.sessions_played}, lost to the killed worker "
        f"{stats.sessions_lost}, other session answers {dict(stats.session_errors)}; "
        f"submits refused by quota {stats.submits_refused}"
    )
    outside = stats.errors_5xx_outside_faults
    ok &= check(
        not outside,
        f"no 5xx or transport error outside the fault windows ({len(outside)}: "
        f"{outside[:5]}; inside them: {len(stats.failures) - len(outside)})",
    )
    return ok


# ---------------------------------------------------------------- modes


def make_tenants(keys: list[str], first: int, args: argparse.Namespace) -> list[Tenant]:
    out = []
    for i, key in enumerate(keys, first):
        # Spread evenly: every k-th is heavy, every m-th plays sessions.
        heavy = args.heavy > 0 and i % round(1 / args.heavy) == 0
        sessions = args.sessions > 0 and i % round(1 / args.sessions) == 1
        out.append(Tenant(index=i, key=key, heavy=heavy, sessions=sessions))
    return out


async def steady(st: Stack, args: argparse.Namespace) -> bool:
    stats = Stats()
    api = Api(st.api_urls, stats, args.tenants)
    tenants = make_tenants(st.keys, 0, args)
    stop = asyncio.Event()
    t0 = time.monotonic()
    total = 60 * args.minutes
    loops = [asyncio.create_task(tenant_loop(api, t, stats, stop, args)) for t in tenants]
    fault_task = asyncio.create_task(faults(st, stats, total, t0)) if not args.no_faults else None
    while time.monotonic() - t0 < total:
        await asyncio.sleep(min(30.0, max(0.1, total - (time.monotonic() - t0))))
        subs = [s for t in tenants for s in t.runs]
        q = await asyncio.to_thread(queued_now, st.dep.env["RLAAS_DATABASE_URL"])
        print(
            f"  t={time.monotonic() - t0:.0f}s submitted {len(subs)}, ended "
            f"{sum(s.final is not None for s in subs)}, queued {q}, stream events "
            f"{stats.stream_events}, sessions {stats.sessions_played}",
            flush=True,
        )
    stop.set()
    print("  stopped submitting; waiting for unfinished runs", flush=True)
    await asyncio.gather(*loops, return_exceptions=True)
    if fault_task is not None:
        await fault_task
    await api.close()
    # Fault slack: the killed worker's run waits out its lease and the requeue, the worker
    # restarts; Postgres is away for its restart. Runs queued then wait that much longer.
    fault_s = (
        0.0
        if args.no_faults
        else LEASE_S + 5 + 5 + sum(b - a for a, b in stats.fault_windows[1:]) + 30
    )
    return report(tenants, stats, st, fault_s)


async def ramp(st: Stack, args: argparse.Namespace) -> bool:
    stats = Stats()
    steps = [int(x) for x in args.steps.split(",")]
    api = Api(st.api_urls, stats, steps[-1])
    stop = asyncio.Event()
    tenants: list[Tenant] = []
    loops: list[asyncio.Task[None]] = []
    rows, broke = [], None
    for n in steps:
        new = make_tenants(st.keys[len(tenants) : n], len(tenants), args)
        tenants += new
        loops += [asyncio.create_task(tenant_loop(api, t, stats, stop, args)) for t in new]
        stats.step_routes = defaultdict(Route)
        t0, samples = time.monotonic(), []
        while time.monotonic() - t0 < 60 * args.step_minutes:
            await asyncio.sleep(5)
            q = await asyncio.to_thread(queued_now, st.dep.env["RLAAS_DATABASE_URL"])
            if q is not None:
                samples.append((time.monotonic() - t0, float(q)))
        judged = [
            k
            for k, r in stats.step_routes.items()
            if not k.endswith(NOT_JUDGED) and r.count >= MIN_JUDGED_CALLS
        ] or ["-"]
        worst_key = max(judged, key=lambda k: percentile(stats.step_routes[k].kept, 99))
        worst = percentile(stats.step_routes[worst_key].kept, 99)
        b, half = slope([t for t, _ in samples], [q for _, q in samples])
        service = service_times([s for t in tenants for s in t.runs])
        s_mean = statistics.fmean(service) if service else math.nan
        drain = WORKERS * 60 * args.step_minutes / s_mean if service else math.inf
        q_end = samples[-1][1] if samples else math.nan
        grows = b - half > 0 and q_end > drain
        rows.append(
            [
                n,
                f"{worst:.3f}",
                worst_key,
                f"{q_end:.0f}",
                f"{60 * b:+.2f} ± {60 * half:.2f}",
                f"{drain:.0f}",
                "yes" if grows else "no",
            ]
        )
        print(
            f"  {n} tenants: worst p99 {worst:.3f} s ({worst_key}), queue {q_end:.0f}, slope "
            f"{60 * b:+.2f}/min",
            flush=True,
        )
        if worst > 1.0 or grows:
            broke = (n, "p99 > 1 s" if worst > 1.0 else "queue grows")
            break
    stop.set()
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    await api.close()
    print(
        "\nRamp (each step "
        f"{args.step_minutes} min; 'drainable' = runs the workers finish in a step):"
    )
    print(
        table(
            [
                "tenants",
                "worst p99 s",
                "route",
                "queued at end",
                "queue slope /min (95 %)",
                "drainable",
                "grows",
            ],
            rows,
        )
    )
    print("\nPer route over the whole ramp:")
    print(route_table(stats.routes))
    if broke:
        print(f"\nBREAKING POINT: {broke[0]} tenants ({broke[1]})")
    else:
        print(f"\nno breaking point up to {steps[-1]} tenants")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--think-s", type=float, default=20.0, help="mean pause between submits")
    parser.add_argument("--heavy", type=float, default=0.1, help="share of heavy tenants")
    parser.add_argument("--heavy-outstanding", type=int, default=4)
    parser.add_argument("--sessions", type=float, default=0.2, help="share playing sessions")
    parser.add_argument("--drain-minutes", type=float, default=30.0)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--ramp", action="store_true")
    parser.add_argument("--steps", default="10,25,50,100,150")
    parser.add_argument("--step-minutes", type=float, default=3.0)
    args = parser.parse_args()
    n = max(int(x) for x in args.steps.split(",")) if args.ramp else args.tenants
    with stack(n) as st:
        ok = asyncio.run(ramp(st, args) if args.ramp else steady(st, args))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
