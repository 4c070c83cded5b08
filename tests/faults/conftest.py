"""A deployment with PostgreSQL and Redis of its own, for tests that stop and restart them
(the session's servers are shared with the other tests of the run)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.stack import REPO, Stack, enrol_worker, free_port, rlaas, wait_until

SERVICES = str(REPO / "scripts" / "services.sh")


def services(command: str, folder: str) -> None:
    """``scripts/services.sh <command> <folder>``: start, stop, pg-stop, redis-start, ..."""
    done = subprocess.run([SERVICES, command, folder], capture_output=True, text=True)
    assert done.returncode == 0, f"services.sh {command} failed:\n{done.stderr}"


def finished(
    stack: Stack, client: httpx.Client, run_id: str, timeout_s: float = 300
) -> dict[str, Any]:
    """The run once it has ended (succeeded, failed or cancelled)."""

    def ended() -> dict[str, Any] | None:
        run: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None

    result: dict[str, Any] = wait_until(ended, timeout_s, f"run {run_id} to finish", stack)
    return result


def retries(stack: Stack) -> int:
    """Calls to the control plane the worker has had to retry so far (worker/api_client.py)."""
    log = (stack.logs / "worker.log").read_text(errors="replace")
    return sum(1 for line in log.splitlines() if "control plane" in line and "retrying in" in line)


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    """A stack (not started) on servers of its own, and their folder for `services`.

    The reaper runs every second and sends a run again after 3 s in ``queued``, so a
    test of a lost dispatch waits seconds, not the default five minutes."""
    # Under /tmp, not tmp_path: the postgres OS user must be able to reach it.
    folder = tempfile.mkdtemp(prefix="rlaas-faults-", dir="/tmp")
    services("start", folder)
    urls = dict(
        line.removeprefix("export ").split("=", 1)
        for line in Path(folder, "env").read_text().splitlines()
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "RLAAS_DATABASE_URL": urls["RLAAS_TEST_DATABASE_URL"],
        "RLAAS_BROKER_URL": urls["RLAAS_TEST_REDIS_URL"],
        "RLAAS_SECRET_KEY": secrets.token_urlsafe(32),
        "RLAAS_DATA_DIR": str(tmp_path / "data"),
        "RLAAS_API_URL": f"http://127.0.0.1:{port}",
        "RLAAS_REAPER_INTERVAL_S": "1",
        "RLAAS_REDISPATCH_AFTER_S": "3",
        # A run whose worker died is queued again 1 s after its lease ended (5 s by default).
        "RLAAS_REQUEUE_BACKOFF_S": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for argv in (["migrate"], ["tenants", "create", "faults"]):
        done = subprocess.run([*rlaas(), *argv], env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"rlaas {' '.join(argv)} failed:\n{done.stderr}"
    api_key = done.stdout.strip().splitlines()[-1]
    env["RLAAS_WORKER_CREDENTIAL"] = enrol_worker(env, "faults-worker")  # as an operator would
    stack = Stack(
        api_url=env["RLAAS_API_URL"],
        api_key=api_key,
        env=env,
        logs=logs,
    )
    try:
        yield stack, folder
    finally:
        stack.stop_all()
        subprocess.run([SERVICES, "stop", folder], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
