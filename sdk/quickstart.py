"""``rlaas quickstart``: the whole product on one machine, with a demo that learns.

Everything lives under one data folder: the SQLite database, the server-less
broker (kombu's SQLAlchemy transport on a SQLite file), the worker token, the
quickstart tenant's key and the logs. Running it again reuses the folder (same
tenant, earlier runs still listed). The control plane and the worker run as
child processes, as they would in production; Ctrl-C stops both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from rl_core.spec import parse_spec
from sdk.client import Client
from sdk.follow import follow_run

TENANT = "quickstart"
# A deployment's settings in the user's shell would point the embedded parts elsewhere (or,
# for the worker credential and the shared token's switch, shut out the embedded worker).
EMBEDDED_ONLY = (
    "RLAAS_DATABASE_URL",
    "RLAAS_BROKER_URL",
    "RLAAS_API_URL",
    "RLAAS_WORKER_TOKEN",
    "RLAAS_WORKER_CREDENTIAL",
    "RLAAS_ALLOW_SHARED_WORKER_TOKEN",
)

console = Console(stderr=True)


def run_quickstart(
    data_dir: Path, *, port: int, exit_when_done: bool, spec: dict[str, object] | None = None
) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "logs").mkdir(exist_ok=True)
    # This process (migrations, the tenant) and its children all use the embedded default.
    for name in EMBEDDED_ONLY:
        os.environ.pop(name, None)
    os.environ["RLAAS_DATA_DIR"] = str(data_dir)
    env = {**os.environ, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}

    api_key = _tenant_key(data_dir)
    port = port if port and _port_free(port) else _free_port()  # 0: any free port
    api_url = f"http://127.0.0.1:{port}"
    env["RLAAS_API_URL"] = api_url
    console.print(f"[bold]rlaas quickstart[/bold]: data in {data_dir}")
    with _children() as procs:
        procs.append(
            _spawn(
                "api",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.main:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                env,
                data_dir,
            )
        )
        _wait_ready(api_url, procs[0])
        procs.append(_spawn("worker", [sys.executable, "-m", "sdk.cli", "worker"], env, data_dir))
        # Checkpoints are served by a worker of their own (docs/serving.md): on the run's
        # worker, a served checkpoint would hold it (until idle) and runs would wait.
        serve = [sys.executable, "-m", "sdk.cli", "worker", "--queue", "serve"]
        procs.append(_spawn("serve-worker", serve, env, data_dir))
        _warn_of_a_weak_sandbox()
        console.print(f"control plane at {api_url} (API docs at {api_url}/docs)")
        console.print(f"logs in {data_dir / 'logs'}")
        with Client(api_url, api_key) as client:
            run = client.create_run(spec or demo_spec())
            what = "the tiny model learns to guess a number" if spec is None else "your spec"
            console.print(f"submitted run {run.id}: {what}")
            # The page reads the key from the fragment (never sent to the server), keeps it
            # in the browser and clears it from the address bar.
            console.print(f"dashboard: [link]{api_url}/#key={api_key}&run={run.id}[/link]")
            run = follow_run(client, run.id)
        ok = run.status == "succeeded"
        console.print(f"demo run {run.status}" if ok else f"[red]demo run {run.status}[/red]")
        if exit_when_done:
            return 0 if ok else 1
        console.print(f"still serving at {api_url}; press Ctrl-C to stop")
        with contextlib.suppress(KeyboardInterrupt):
            while all(p.poll() is None for p in procs):
                time.sleep(1.0)
    return 0


def demo_spec() -> dict[str, object]:
    text = resources.files("sdk").joinpath("quickstart.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    parse_spec(data)  # fail here, not in the worker, if the packaged spec is stale
    return dict(data)


def _warn_of_a_weak_sandbox() -> None:
    """The embedded worker runs code_exec programs behind the strongest wall this machine
    has; where that is not bubblewrap, the user reads it here (and in each run's claim
    event), not only in the worker's log."""
    from worker.settings import WorkerSettings
    from worker.startup import sandbox_wall

    report = sandbox_wall(WorkerSettings())
    if report.weak:
        console.print(f"[yellow]warning: {report.message}[/yellow]", markup=True, highlight=False)


def _tenant_key(data_dir: Path) -> str:
    """The quickstart tenant's key, created on first use and kept in the data folder."""
    from app.admin import create_tenant, migrate
    from app.settings import Settings

    key_file = data_dir / "quickstart.key"
    settings = Settings()
    # Decided before migrating, which creates the database: an existing database
    # without our key file may hold a "quickstart" tenant already.
    fresh = not (data_dir / "rlaas.db").exists()
    migrate(settings)
    if key_file.exists():
        return key_file.read_text(encoding="utf-8").strip()
    name = TENANT if fresh else f"{TENANT}-{int(time.time())}"
    _, key = asyncio.run(create_tenant(settings, name))
    key_file.write_text(key + "\n", encoding="utf-8")
    key_file.chmod(0o600)
    return key


def _spawn(
    name: str, argv: list[str], env: dict[str, str], data_dir: Path
) -> subprocess.Popen[bytes]:
    log = (data_dir / "logs" / f"{name}.log").open("ab")
    # A new session: Ctrl-C in the terminal reaches us, and we stop the children in order.
    return subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


@contextlib.contextmanager
def _children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        console.print("stopped the control plane and the worker")


def _wait_ready(api_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the control plane exited with {proc.returncode}; see its log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise SystemExit(f"the control plane did not become ready within {timeout_s:.0f}s")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
