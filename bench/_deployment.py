"""A whole rlaas deployment on loopback for benchmarks (B12), started as an operator would.

PostgreSQL and Redis from ``scripts/services.sh`` (a new cluster, so a fresh
database; as root, Postgres runs as the ``postgres`` user, which is why the
folder is under /tmp), then ``rlaas migrate``, ``rlaas tenants create`` (the
key is its last line), the API (``rlaas serve``) and one Celery worker
(``rlaas worker``), each a process of its own with the environment
tests/e2e/conftest.py gives them, plus ``RLAAS_ENV_URL_ALLOWLIST=loopback``:
a server calls public addresses only unless told, and a benchmark's webhook
environment runs on this machine. More processes (an environment server) can
be started beside them with `Deployment.start`. Everything is stopped, and
the folder removed, on exit, even after a failure; the processes' logs are
printed then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.b8_stack import REPO, free_port

LOG_TAIL = 3000


@dataclasses.dataclass
class Deployment:
    env: dict[str, str]
    logs: Path
    api_url: str = ""
    api_key: str = ""
    procs: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    def start(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            argv, env={**self.env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )

    def wait_ready(self, name: str, url: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"{name} did not become ready at {url}\n{self.tails()}")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def tails(self) -> str:
        return "\n".join(
            f"----- {log.name} -----\n{log.read_text(errors='replace')[-LOG_TAIL:]}"
            for log in sorted(self.logs.glob("*.log"))
        )


def rlaas(*argv: str) -> list[str]:
    return [sys.executable, "-m", "sdk.cli", *argv]


@contextlib.contextmanager
def deployment() -> Iterator[Deployment]:
    """Postgres + Redis, a migrated database, a tenant, the API and a worker."""
    folder = Path(tempfile.mkdtemp(prefix="rlaas-bench-", dir="/tmp"))  # reachable by `postgres`
    services = str(REPO / "scripts" / "services.sh")
    logs = folder / "logs"
    logs.mkdir()
    dep: Deployment | None = None
    try:
        subprocess.run([services, "start", str(folder)], check=True, capture_output=True)
        lines = (folder / "env").read_text().splitlines()
        urls = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        port = free_port()
        env = {
            **os.environ,
            "RLAAS_DATABASE_URL": urls["RLAAS_TEST_DATABASE_URL"],  # a new cluster: a fresh db
            "RLAAS_BROKER_URL": urls["RLAAS_TEST_REDIS_URL"],
            "RLAAS_WORKER_TOKEN": secrets.token_urlsafe(24),
            # Kept on: a bench measures load, not enrolment (deprecated; warned once an hour).
            "RLAAS_ALLOW_SHARED_WORKER_TOKEN": "1",
            "RLAAS_SECRET_KEY": secrets.token_urlsafe(32),
            "RLAAS_DATA_DIR": str(folder / "data"),
            "RLAAS_API_URL": f"http://127.0.0.1:{port}",
            # A server calls public addresses only unless told; the env server is on loopback.
            "RLAAS_ENV_URL_ALLOWLIST": "loopback",
            "PYTHONUNBUFFERED": "1",
        }
        dep = Deployment(env=env, logs=logs)
        for argv in (["migrate"], ["tenants", "create", "bench"]):
            done = subprocess.run(rlaas(*argv), env=env, cwd=REPO, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"rlaas {' '.join(argv)} failed:\n{done.stderr}")
        dep.api_key = done.stdout.strip().splitlines()[-1]
        dep.api_url = env["RLAAS_API_URL"]
        dep.start("api", rlaas("serve", "--port", str(port)))
        dep.wait_ready("api", f"{dep.api_url}/readyz")
        dep.start("worker", rlaas("worker", "--loglevel", "WARNING"))
        yield dep
    except BaseException:
        if dep is not None:
            print(dep.tails(), file=sys.stderr)
        raise
    finally:
        if dep is not None:
            dep.stop()
        subprocess.run([services, "stop", str(folder)], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["Deployment", "deployment", "rlaas"]
