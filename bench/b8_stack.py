"""The control-plane stack that B8, B9 and B10 measure: Postgres + uvicorn, started here.

``Stack`` starts a throwaway PostgreSQL (and Redis, for the run dispatcher)
with ``scripts/services.sh``, migrates a fresh database, creates a tenant and
serves ``app.main:app`` with uvicorn in a child process, exactly as a
deployment would (JSON access logs off: a benchmark measures the API, not
the terminal). Everything is stopped on exit, even after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
WORKER_TOKEN = "bench-worker-token"
SECRET_KEY = secrets.token_urlsafe(32)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [
        [f"{c:,.1f}" if isinstance(c, float) else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass
class Stack:
    database_url: str  # SQLAlchemy form
    base_url: str
    api_key: str
    folder: Path
    leases: dict[str, str] = field(default_factory=dict)  # run id -> its claim's lease token

    @property
    def libpq_url(self) -> str:
        return self.database_url.replace("postgresql+psycopg://", "postgresql://")

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def worker(self) -> dict[str, str]:
        """The shared worker token: it opens claims only."""
        return {"Authorization": f"Bearer {WORKER_TOKEN}"}

    def lease(self, run_id: str) -> dict[str, str]:
        """A claimed run's other worker routes take the lease token of its claim."""
        return {"Authorization": f"Bearer {self.leases[run_id]}"}

    async def running_runs(self, client: httpx.AsyncClient, n: int, worker: str) -> list[str]:
        """``n`` runs claimed by ``worker`` and reported running: ready to take metrics."""
        spec = {"environment": {"name": "guess_number"}, "train": {"steps": 1_000_000}}
        ids = []
        for _ in range(n):
            r = await client.post("/v1/runs", json={"spec": spec}, headers=self.auth)
            r.raise_for_status()
            run_id = r.json()["id"]
            r = await client.post(
                f"/internal/runs/{run_id}/claim",
                json={"worker_id": worker, "lease_seconds": 3600},
                headers=self.worker,
            )
            r.raise_for_status()
            self.leases[run_id] = r.json()["lease_token"]
            r = await client.post(
                f"/internal/runs/{run_id}/status",
                json={"worker_id": worker, "status": "running"},
                headers=self.lease(run_id),
            )
            r.raise_for_status()
            ids.append(run_id)
        return ids


@contextlib.contextmanager
def stack(*, uvicorn_args: Sequence[str] = ()) -> Iterator[Stack]:
    """Postgres, a migrated database, a tenant and uvicorn; all stopped on exit."""
    folder = Path(tempfile.mkdtemp(prefix="rlaas-bench-", dir="/tmp"))
    services = str(REPO / "scripts" / "services.sh")
    server: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([services, "start", str(folder)], check=True, capture_output=True)
        env_lines = (folder / "env").read_text().splitlines()
        urls = dict(line.removeprefix("export ").split("=", 1) for line in env_lines)
        database_url = urls["RLAAS_TEST_DATABASE_URL"]
        env = {
            **os.environ,
            "RLAAS_DATABASE_URL": database_url,
            "RLAAS_BROKER_URL": urls["RLAAS_TEST_REDIS_URL"],
            "RLAAS_WORKER_TOKEN": WORKER_TOKEN,
            # Kept on: a bench measures load, not enrolment (deprecated; warned once an hour).
            "RLAAS_ALLOW_SHARED_WORKER_TOKEN": "1",
            "RLAAS_SECRET_KEY": SECRET_KEY,
            "RLAAS_LOG_JSON": "false",
            # The load is the point here: quotas would only measure the limiter.
            "RLAAS_QUOTA_REQUESTS_PER_MINUTE": "100000000",
            "RLAAS_QUOTA_RUNS_IN_FLIGHT": "100000",
            "RLAAS_REAPER_INTERVAL_S": "3600",
        }
        subprocess.run(
            [sys.executable, "-c", "from app.admin import migrate; from app.settings import "
             "Settings; migrate(Settings())"],
            check=True, env=env, cwd=REPO, capture_output=True,
        )  # fmt: skip
        key = subprocess.run(
            [sys.executable, "-c", "import asyncio; from app.admin import create_tenant; "
             "from app.settings import Settings; "
             "print(asyncio.run(create_tenant(Settings(), 'bench'))[1])"],
            check=True, env=env, cwd=REPO, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
             "--port", str(port), "--no-access-log", "--log-level", "warning", *uvicorn_args],
            env=env, cwd=REPO,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not become ready; see its output above")
            time.sleep(0.2)
        yield Stack(database_url=database_url, base_url=base, api_key=key, folder=folder)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        subprocess.run([services, "stop", str(folder)], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


async def sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
