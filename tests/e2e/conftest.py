"""Fixtures for end-to-end tests: a fresh deployment per test (see stack.py)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import REPO, Stack, free_port, fresh_database, rlaas


@pytest.fixture
def stack(postgres_url: str, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "RLAAS_DATABASE_URL": fresh_database(postgres_url),
        "RLAAS_BROKER_URL": redis_url.rsplit("/", 1)[0] + f"/{secrets.randbelow(15) + 1}",
        "RLAAS_WORKER_TOKEN": secrets.token_urlsafe(24),
        "RLAAS_SECRET_KEY": secrets.token_urlsafe(32),
        "RLAAS_DATA_DIR": str(tmp_path / "data"),
        "RLAAS_API_URL": f"http://127.0.0.1:{port}",
        "PYTHONUNBUFFERED": "1",
    }
    for argv in (["migrate"], ["tenants", "create", "e2e"]):
        done = subprocess.run([*rlaas(), *argv], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"rlaas {' '.join(argv)} failed:\n{done.stderr}"
    api_key = done.stdout.strip().splitlines()[-1]
    s = Stack(api_url=env["RLAAS_API_URL"], api_key=api_key, env=env, logs=logs)
    try:
        yield s
    finally:
        for name in list(s.procs):
            s.stop(name)
