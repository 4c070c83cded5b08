"""A whole rlaas deployment on loopback, for end-to-end tests.

Real parts only: a fresh database on the session's PostgreSQL, Redis as the
broker, the API under uvicorn and a Celery worker, each its own process, set
up the way an operator would (``rlaas migrate``, ``rlaas tenants create``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    api_url: str
    api_key: str
    env: dict[str, str]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30
        )

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        self.procs[name] = proc
        return proc

    def start_api(self) -> None:
        port = self.api_url.rsplit(":", 1)[1]
        self.start("api", [*rlaas(), "serve", "--port", port])
        wait_until(lambda: _ready(self.api_url), 60, "the API to become ready", self)

    def start_worker(self, name: str = "worker") -> subprocess.Popen[bytes]:
        # --serve: it also loads checkpoints tenants call (docs/serving.md), as a
        # deployment's serve workers do.
        return self.start(name, [*rlaas(), "worker", "--serve", "--loglevel", "INFO"])

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        """Every process, the API last, as a deployment is taken down: a worker whose API
        is gone retries its calls (RLAAS_API_RETRY_SECONDS, 120 s) and its warm shutdown
        waits for them, so stopped after the API it outlived the 20 s wait and was killed."""
        for name in sorted(self.procs, key=lambda name: name == "api"):
            self.stop(name)

    def dump_logs(self) -> str:
        return "\n".join(
            f"----- {log.name} -----\n{log.read_text(errors='replace')[-6000:]}"
            for log in sorted(self.logs.glob("*.log"))
        )


def rlaas() -> list[str]:
    return [sys.executable, "-m", "sdk.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check, timeout_s: float, what: str, stack: Stack | None = None):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    logs = stack.dump_logs() if stack else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{logs}")


def _ready(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def fresh_database(postgres_url: str) -> str:
    """A new, empty database on the session's server; returns its SQLAlchemy URL."""
    name = f"e2e_{uuid.uuid4().hex[:10]}"
    conninfo = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = postgres_url.rpartition("/")
    return f"{base}/{name}"


def enrol_worker(env: dict[str, str], name: str) -> str:
    """A worker credential issued as an operator does (`rlaas workers issue NAME`)."""
    done = subprocess.run(
        [*rlaas(), "workers", "issue", name], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, f"rlaas workers issue failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def enrol_known(database_url: str, credential: str, name: str) -> None:
    """Enrol a credential fixed in a test module (its hash, as `rlaas workers issue` keeps
    it), for tests whose workers are set up before the database exists."""
    from app.security import hash_key, parse_worker_prefix

    prefix = parse_worker_prefix(credential)
    assert prefix is not None, "a worker credential is rlaas_worker_<12 hex>_<secret>"
    conninfo = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO worker_credentials (id, name, prefix, secret_hash, created_at) "
            "VALUES (%s, %s, %s, %s, now())",
            (f"wcr_{prefix}", name, prefix, hash_key(credential)),
        )
