"""Fixtures for end-to-end tests: a fresh deployment per test (see stack.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.e2e.stack import REPO, Stack, enrol_worker, free_port, fresh_database, rlaas


def broker_url(redis_url: str) -> str:
    """A Redis database of this test process's own, emptied: stacks run one at a time per
    process, and pytest-xdist's workers (gw0, gw1, ...) each get another. 9 is
    test_dispatch's; 10 and up are these."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    url = redis_url.rsplit("/", 1)[0] + f"/{10 + int(worker.removeprefix('gw')) % 6}"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def stack(postgres_url: str, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "RLAAS_DATABASE_URL": fresh_database(postgres_url),
        "RLAAS_BROKER_URL": broker_url(redis_url),
        "RLAAS_SECRET_KEY": secrets.token_urlsafe(32),
        "RLAAS_DATA_DIR": str(tmp_path / "data"),
        # A run whose worker died is queued again 1 s after its lease ended (5 s by default).
        "RLAAS_REQUEUE_BACKOFF_S": "1",
        "RLAAS_API_URL": f"http://127.0.0.1:{port}",
        "PYTHONUNBUFFERED": "1",
    }
    for argv in (["migrate"], ["tenants", "create", "e2e"]):
        done = subprocess.run([*rlaas(), *argv], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"rlaas {' '.join(argv)} failed:\n{done.stderr}"
    api_key = done.stdout.strip().splitlines()[-1]
    # Workers enrolled as an operator enrols them; the shared token is off (the default
    # of a control plane on a database server), so a run trained here proves the path.
    env["RLAAS_WORKER_CREDENTIAL"] = enrol_worker(env, "e2e-worker")
    s = Stack(api_url=env["RLAAS_API_URL"], api_key=api_key, env=env, logs=logs)
    try:
        yield s
    finally:
        s.stop_all()
