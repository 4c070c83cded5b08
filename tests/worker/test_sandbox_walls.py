"""A worker's sandbox wall: bubblewrap here or not, embedded or deployed, and the opt-out.

Bubblewrap's absence is real: PATH holds ``unshare`` and ``true`` but no ``bwrap``, and
the probes' caches are cleared (tests/rl_core/envs/test_sandbox_walls.py). The settings
are read from the environment, as a worker reads them. The last test runs the worker's
own ``execute_run`` against the control plane on loopback (real PostgreSQL): a deployed
worker without bubblewrap fails a ``code_exec`` run at its first reset with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rl_core.envs.code_exec import CodeExec
from rl_core.envs.walls import assess
from rl_core.errors import SandboxRefused
from tests.rl_core.envs.test_sandbox_walls import forget_probes, path_without_bwrap
from tests.web.live import WORKER_TOKEN, LiveApi, live_api, migrated_database
from worker.job import execute_run
from worker.settings import WorkerSettings
from worker.startup import announce

MODES = {
    "embedded": {},
    "deployed": {"RLAAS_BROKER_URL": "redis://127.0.0.1:1/0"},
    "deployed-opt-out": {
        "RLAAS_BROKER_URL": "redis://127.0.0.1:1/0",
        "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP": "1",
    },
}
# What tenant code gets without bubblewrap; with it, every mode runs it behind bwrap.
WITHOUT_BWRAP = {
    "embedded": "runs_on_weak_wall",
    "deployed": "refused",
    "deployed-opt-out": "runs_on_weak_wall",
}


@pytest.fixture(params=["bwrap", "no-bwrap"])
def host(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[str]:
    if request.param == "no-bwrap":
        monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
    forget_probes()
    yield str(request.param)
    monkeypatch.undo()
    forget_probes()


def settings_for(mode: str, monkeypatch: pytest.MonkeyPatch, **extra: str) -> WorkerSettings:
    for name in ("RLAAS_BROKER_URL", "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**MODES[mode], **extra}.items():
        monkeypatch.setenv(name, value)
    return WorkerSettings()


@pytest.mark.parametrize("mode", list(MODES))
def test_each_host_and_mode_gets_the_wall_it_should(
    host: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(mode, monkeypatch)
    report = assess(settings.sandbox_walls())
    expected = "runs" if host == "bwrap" else WITHOUT_BWRAP[mode]
    assert report.tenant_code == expected, report.message
    assert (report.wall == "bwrap") == (host == "bwrap")
    env = CodeExec(settings.sandbox_walls())
    if expected == "refused":
        with pytest.raises(SandboxRefused, match="RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP=1"):
            asyncio.run(env.reset("e", 0, {"tasks": ["add"]}))
        return
    info = asyncio.run(env.reset("e", 0, {"tasks": ["add"]})).info
    if expected == "runs_on_weak_wall":
        who = "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP=1" if "opt-out" in mode else "embedded"
        assert who in info["sandbox_warning"], info
    else:
        assert "sandbox_warning" not in info and info["isolation"] == "bwrap"


def test_the_start_up_line_says_the_wall_and_the_fix(
    host: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.startup import log_sandbox_wall

    caplog.set_level("INFO", logger="worker.startup")
    log_sandbox_wall(settings_for("deployed", monkeypatch))
    (record,) = [r for r in caplog.records if r.name == "worker.startup"]
    if host == "bwrap":
        assert record.levelname == "INFO" and "sandbox wall: bubblewrap" in record.getMessage()
    else:
        assert record.levelname == "ERROR"
        assert "refuses to run tenant code" in record.getMessage()
        assert "install Debian's `bubblewrap`" in record.getMessage()


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def test_a_deployed_worker_without_bubblewrap_fails_the_run_with_the_reason(
    live: LiveApi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))
    forget_probes()
    try:
        settings = settings_for(
            "deployed",
            monkeypatch,
            RLAAS_API_URL=live.url,
            RLAAS_WORKER_TOKEN=WORKER_TOKEN,
            RLAAS_DATA_DIR=str(tmp_path / "data"),
            RLAAS_WORKER_ID="worker-without-bwrap",
        )
        announce(settings).join(timeout=30)  # what Celery's worker_ready does
        auth = {"Authorization": f"Bearer {live.tenant()}"}
        spec = {
            "environment": {"name": "code_exec", "config": {"tasks": ["add"]}},
            "rollout": {"group_size": 2, "concurrency": 2},
            "train": {"steps": 1},
        }
        created = httpx.post(f"{live.url}/v1/runs", json={"spec": spec}, headers=auth, timeout=30)
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        started = time.monotonic()
        assert execute_run(run_id, settings) == "failed"
        took = time.monotonic() - started
    finally:
        monkeypatch.undo()
        forget_probes()

    run = httpx.get(f"{live.url}/v1/runs/{run_id}", headers=auth, timeout=30).json()
    assert run["status"] == "failed" and run["current_step"] == 0, run
    reason = run["error"]
    assert reason.startswith("SandboxRefused: sandbox wall: none strong enough"), reason
    assert "bubblewrap is not installed" in reason
    assert "install Debian's `bubblewrap`" in reason
    assert "RLAAS_UNSAFE_SANDBOX_WITHOUT_BWRAP=1" in reason
    events = httpx.get(f"{live.url}/v1/runs/{run_id}/events", headers=auth, timeout=30).json()
    reasons = [e["reason"] for e in events["items"]]
    assert any(
        "claimed by worker-without-bwrap" in r and "refuses tenant code" in r for r in reasons
    )
    # Failed once, not retried: one attempt, the run's failure is final.
    assert run["attempts"] == 1, run
    ready = httpx.get(f"{live.url}/readyz", timeout=30).json()
    (mine,) = [w for w in ready["workers"] if w["worker_id"] == "worker-without-bwrap"]
    assert mine["tenant_code"] == "refused" and mine["sandbox_wall"] in ("namespace", "audit")
    assert mine["queue"] == "cpu"
    print(f"refused in {took:.1f}s")
