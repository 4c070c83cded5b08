"""A doubled step stops the attempt at once: the worker, against the real control plane
(uvicorn on loopback, real PostgreSQL), trains until the API refuses a step's report as
one this attempt already reported (another worker holds the run under the same attempt),
then trains no further step, writes no checkpoint, reports nothing more and lets the run go.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.db.models import StepUpdate, utcnow
from app.db.session import AsyncSession, make_engine
from tests.web.live import WORKER_TOKEN, LiveApi, live_api, migrated_database
from worker.job import execute_run
from worker.settings import WorkerSettings

STEPS = 200  # what the attempt would train if nothing stopped it
DOUBLED = 3  # the step another worker already reported under this attempt


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def report_step_elsewhere(live: LiveApi, run_id: str, step: int) -> None:
    """Store attempt 1's update of ``step`` as another worker holding the run would have."""

    async def insert() -> None:
        engine = make_engine(live.settings.database_url)
        try:
            async with AsyncSession(engine) as session:
                session.add(
                    StepUpdate(
                        run_id=run_id,
                        step=step,
                        attempt=1,
                        base_step=step - 1,
                        base_attempt=1,
                        optimizer_updates=step,
                        created_at=utcnow(),
                    )
                )
                await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(insert())


def test_a_refused_doubled_step_stops_training_and_reporting_at_once(
    live: LiveApi,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth = {"Authorization": f"Bearer {live.tenant()}"}
    spec = {
        "model": {"source": "builtin:tiny"},
        "environment": {"name": "guess_number", "config": {"low": 1, "high": 3}},
        "agent": {"max_turns": 2, "max_new_tokens": 4, "max_context": 64},
        "rollout": {"group_size": 2, "concurrency": 4},
        "algorithm": {"batch_groups": 1},
        "staleness": {"mode": "sync"},
        # A checkpoint every step: one after the refusal would show that it went on.
        "train": {"steps": STEPS, "checkpoint_interval": 1},
    }
    created = httpx.post(f"{live.url}/v1/runs", json={"spec": spec}, headers=auth, timeout=30)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    report_step_elsewhere(live, run_id, DOUBLED)
    for name, value in {
        "RLAAS_API_URL": live.url,
        "RLAAS_WORKER_TOKEN": WORKER_TOKEN,
        "RLAAS_DATA_DIR": str(tmp_path / "data"),
        "RLAAS_WORKER_ID": "worker-doubled",
        "RLAAS_HEARTBEAT_SECONDS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RLAAS_BROKER_URL", raising=False)
    settings = WorkerSettings()

    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        assert execute_run(run_id, settings) == "lease_lost"
    print(f"stopped {time.monotonic() - started:.1f}s after the claim")

    # The attempt trained at most the step after the refused one (in the device thread when
    # the refusal came), and reported none past the last one stored.
    trained = [
        int(m.group(1))
        for r in caplog.records
        if (m := re.match(r"step (\d+): reward", r.getMessage()))
    ]
    assert trained and max(trained) <= DOUBLED + 1, trained
    assert any("stopping the attempt now" in r.getMessage() for r in caplog.records)
    checkpoints = sorted((settings.artifacts_dir() / run_id / "checkpoints").glob("step-*"))
    assert [c.name for c in checkpoints][-1] <= f"step-{DOUBLED + 1:08d}", checkpoints
    # The API holds the steps before the doubled one, and nothing after: the refused batch
    # was rolled back whole, and no status was reported (the run is not ended by this
    # worker: whoever holds it goes on).
    loss = httpx.get(
        f"{live.url}/v1/runs/{run_id}/metrics", params={"name": "loss"}, headers=auth, timeout=30
    ).json()
    assert [p["step"] for p in loss["points"]] == list(range(1, DOUBLED))
    run = httpx.get(f"{live.url}/v1/runs/{run_id}", headers=auth, timeout=30).json()
    assert run["status"] == "running" and run["current_step"] == DOUBLED - 1, run
    recorded = httpx.get(f"{live.url}/v1/runs/{run_id}/checkpoints", headers=auth, timeout=30)
    assert max(c["step"] for c in recorded.json()["items"]) <= DOUBLED, recorded.json()
