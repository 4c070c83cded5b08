"""A real MLflow tracking server on loopback, for the tracker tests.

``mlflow server`` of mlflow-skinny with Flask (the dev extra): a SQLite store in a
temporary folder, one uvicorn worker, and MLflow's job runner off (it starts a job
process and seven huey consumers, each importing mlflow: most of the start-up time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

START_TIMEOUT_S = 120.0  # two busy cores: ~10 s idle, ~30 s under a full test run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def mlflow_server() -> Iterator[str]:
    """Start a server, yield its URL (``http://127.0.0.1:<port>``), stop it."""
    folder = Path(tempfile.mkdtemp(prefix="rlaas-test-mlflow-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", str(folder / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (folder / "server.log").open("wb")
    # Its own process group: `mlflow server` runs uvicorn as a child, stopped with it.
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_until_ready(url, process, folder / "server.log")
        yield url
    finally:
        stop_group(process)
        log.close()


def _wait_until_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            # /health answers before the store is migrated; an experiments call needs it.
            answer = httpx.get(
                f"{url}/api/2.0/mlflow/experiments/get-by-name",
                params={"experiment_name": "Default"},
                timeout=5,
            )
            if answer.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mlflow server not ready in {START_TIMEOUT_S:.0f}s")


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started in its own process group: SIGTERM, then SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
