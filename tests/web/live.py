"""The control plane under a real uvicorn on loopback, and a worker that feeds it.

For tests whose client is not Python's ASGI transport: a browser, or the sync
SDK. The server runs in a thread of the test process (uvicorn installs no signal
handlers off the main thread), on a socket bound to port 0, on a fresh database
migrated with Alembic. Its dispatcher only records: the "worker" here is the
test itself, posting to /internal as a worker would, lease first.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from app.admin import create_tenant, migrate
from app.dispatch import RecordingDispatcher
from app.main import create_app
from app.settings import Settings
from tests.e2e.stack import enrol_known, fresh_database

REPO = Path(__file__).resolve().parents[2]
# The workers' credential here: enrolled in every database migrated_database makes (a
# worker sends it as RLAAS_WORKER_TOKEN or RLAAS_WORKER_CREDENTIAL, the same bearer).
WORKER_TOKEN = "rlaas_worker_11ve7e570000_live-test-worker-credential"


def migrated_database(postgres_url: str) -> str:
    url = fresh_database(postgres_url)
    migrate(Settings(database_url=url))
    enrol_known(url, WORKER_TOKEN, "live-test-worker")
    return url


@dataclass
class LiveApi:
    url: str
    settings: Settings

    def tenant(self, name: str | None = None) -> str:
        """A new tenant; returns its API key."""
        _, key = asyncio.run(create_tenant(self.settings, name or f"t-{uuid.uuid4().hex[:8]}"))
        return key

    def worker(self, run_id: str) -> Worker:
        return Worker(self.url, run_id)


@contextlib.contextmanager
def live_api(database_url: str, **overrides: Any) -> Iterator[LiveApi]:
    values: dict[str, Any] = {
        "database_url": database_url,
        "secret_key": secrets.token_urlsafe(32),
        "reaper_interval_s": 3600,
        "log_json": False,  # the test's own logging stays as pytest set it
        "gc_freeze": False,  # a full collection of the test process's heap per start
    }
    settings = Settings(**{**values, **overrides})
    app = create_app(settings, dispatcher=RecordingDispatcher())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("uvicorn did not start (see the log above)")
        time.sleep(0.05)
    try:
        yield LiveApi(url=f"http://127.0.0.1:{port}", settings=settings)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@dataclass
class Worker:
    """What worker/ does over /internal, by hand: claim, then report."""

    url: str
    run_id: str
    worker_id: str = field(default_factory=lambda: f"test-worker-{uuid.uuid4().hex[:6]}")
    seq: dict[str, int] = field(default_factory=dict)
    lease_token: str = ""  # the claim's answer: the credential of every later call

    def post(self, action: str, **body: Any) -> dict[str, Any]:
        token = WORKER_TOKEN if action == "claim" else self.lease_token
        response = httpx.post(
            f"{self.url}/internal/runs/{self.run_id}/{action}",
            json={"worker_id": self.worker_id, **body},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert response.status_code < 300, f"{action}: {response.status_code} {response.text}"
        data: dict[str, Any] = response.json()
        if action == "claim":
            self.lease_token = data["lease_token"]
        return data

    def batch(self, kind: str, **body: Any) -> dict[str, Any]:
        seq = self.seq.get(kind, 0)
        self.seq[kind] = seq + 1
        return self.post(kind, seq=seq, **body)

    def start(self) -> None:
        self.post("claim", lease_seconds=300)
        self.post("status", status="running")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.batch(
            "metrics", points=[{"step": step, "name": n, "value": v} for n, v in metrics.items()]
        )

    def spans(self, spans: list[dict[str, Any]]) -> None:
        self.batch("spans", spans=spans)

    def trajectories(self, trajectories: list[dict[str, Any]]) -> None:
        self.batch("trajectories", trajectories=trajectories)

    def heartbeat(self, inflight: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.post("heartbeat", lease_seconds=300, inflight=inflight)

    def finish(self, status: str = "succeeded", error: str | None = None) -> None:
        self.post("status", status=status, error=error)
