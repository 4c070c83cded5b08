"""The README's "API in brief" commands, run in the README's order on a fresh home.

A new user copies that block into a shell on an empty machine: no ``~/.rlaas``, no
RLAAS_* variables, the embedded default (SQLite, the server-less broker). Each command
here is the README's line itself, run by bash, changed only where a test must: the
virtualenv's path, a free port instead of 8000 (other tests may hold it; the worker is
told it as RLAAS_API_URL), a temporary
file instead of /tmp/run.json, the run id once the POST returned one, and a time limit
on the live stream (it runs until the run ends). The run must be submitted, read back
and claimed by the worker the block starts; training it to the end is the quickstart
test's job (tests/e2e/test_quickstart.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import REPO, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.minutes(1)]

README = (REPO / "README.md").read_text(encoding="utf-8")


def readme_commands() -> list[str]:
    block = re.search(r"## The API in brief\n\n```bash\n(.*?)```", README, re.S)
    assert block, "the README lost its 'API in brief' block"
    return [c.strip() for c in block[1].replace("\\\n", " ").splitlines() if c.strip()]


def test_the_readme_lists_the_schema_before_anything_that_needs_it() -> None:
    commands = readme_commands()
    order = [next(i for i, c in enumerate(commands) if word in c) for word in (
        "rlaas migrate", "rlaas tenants create", "rlaas serve", "rlaas worker", "/v1/runs",
    )]  # fmt: skip
    assert order == sorted(order), commands


def test_the_readmes_commands_work_in_order_on_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAAS_")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), RLAAS_JAX_CACHE_PATH="off")
    venv_bin = f"{Path(sys.executable).parent}/"
    run_json = tmp_path / "run.json"
    background: list[subprocess.Popen[bytes]] = []
    outputs: list[str] = []
    run_id = ""

    def adapt(command: str) -> str:
        command = command.replace(".venv/bin/", venv_bin).replace("/tmp/run.json", str(run_json))
        command = command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        command = command.replace("rlaas serve ", f"rlaas serve --port {port} ")
        # The worker finds the API at :8000 unless told: the same port change, for it.
        command = command.replace(
            f"{venv_bin}rlaas worker",
            f"RLAAS_API_URL=http://127.0.0.1:{port} {venv_bin}rlaas worker",
        )
        command = command.replace("> trace.json", f"> {tmp_path / 'trace.json'}")
        return command.replace("RUN_ID", run_id)

    try:
        for line in readme_commands():
            command = adapt(line)
            if command.endswith("&") or " & " in command:
                log = (tmp_path / f"bg{len(background)}.log").open("wb")
                background.append(
                    subprocess.Popen(
                        ["bash", "-c", command.split(" &")[0]],
                        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
                if "rlaas serve" in command:
                    _wait_ready(f"http://127.0.0.1:{port}", background[-1], tmp_path)
                continue
            assignment = re.fullmatch(r"export (\w+)=\$\((.*)\)\s*(#.*)?", command)
            if assignment:
                name, inner = assignment[1], assignment[2]
                done = _bash(inner, env)
                env[name] = done.stdout.strip()
                assert re.fullmatch(r"rlaas_[\w-]+", env[name]), done.stdout
                continue
            if "/metrics/stream" in command:  # it streams until the run ends
                command = command.replace("curl -sN", "curl -sN --max-time 2")
                _bash(command, env, ok=(0, 28))  # 28: curl's time limit
                continue
            done = _bash(command, env)
            outputs.append(done.stdout)
            if command.endswith("/v1/runs"):
                created = json.loads(done.stdout)
                assert created["status"] == "queued", created
                run_id = created["id"]
        assert run_id, "the README's POST made no run"
        reads = [json.loads(out) for out in outputs if out.startswith("{")]
        assert any(r.get("id") == run_id and "status" in r for r in reads), outputs
        assert "traceEvents" in json.loads((tmp_path / "trace.json").read_text())
        # The worker the README started claims the run from the same fresh home.
        key = env["RLAAS_API_KEY"]
        status = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and status in ("", "queued"):
            got = httpx.get(
                f"http://127.0.0.1:{port}/v1/runs/{run_id}",
                headers={"Authorization": f"Bearer {key}"},
            )
            status = got.json()["status"]
            time.sleep(0.5)
        assert status in ("starting", "running", "succeeded"), (status, _logs(tmp_path))
    finally:
        for proc in background:
            proc.terminate()
        for proc in background:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert (home / ".rlaas" / "rlaas.db").exists()


def _bash(
    command: str, env: dict[str, str], ok: tuple[int, ...] = (0,)
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode in ok, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


def _wait_ready(url: str, proc: subprocess.Popen[bytes], folder: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, _logs(folder)
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the API did not become ready\n{_logs(folder)}")


def _logs(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("bg*.log")))


def test_tenants_create_on_a_fresh_home_makes_the_tables_itself(tmp_path: Path) -> None:
    """An older copy of the README (no `rlaas migrate`) still works on the embedded
    default: `tenants create` brings the schema up first, and prints the key alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLAAS_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "sdk.cli", "tenants", "create", "my-team"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"rlaas_[\w-]+\n", done.stdout), done.stdout
    again = subprocess.run(
        [sys.executable, "-m", "sdk.cli", "tenants", "create", "other-team"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout != done.stdout, again.stderr
