"""The metrics stream on the embedded default (SQLite, one process): notes after commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.admin import create_tenant, migrate
from app.dispatch import RecordingDispatcher
from app.main import create_app
from app.settings import Settings
from tests.app.conftest import spec
from tests.app.test_stream import serving, stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("RLAAS_DATABASE_URL", "RLAAS_BROKER_URL", "RLAAS_WORKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # resync_s an hour: only the after-commit note can wake the feed.
    settings = Settings(data_dir=tmp_path / "rlaas", reaper_interval_s=3600, stream_resync_s=3600)
    migrate(settings)  # synchronous: Alembic runs its own event loop
    return settings


async def test_a_stream_on_sqlite_follows_ingest_and_ends_with_the_run(embedded: Settings) -> None:
    settings = embedded
    _, key = await create_tenant(settings, "local")
    auth = {"Authorization": f"Bearer {key}"}
    app = create_app(settings, dispatcher=RecordingDispatcher())
    async with app.router.lifespan_context(app):
        worker = {
            "Authorization": f"Bearer {(settings.data_dir / 'worker_token').read_text().strip()}"
        }
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://local"
        ) as client:
            run_id = (await client.post("/v1/runs", json={"spec": spec()}, headers=auth)).json()[
                "id"
            ]

            async def internal(action: str, **body: Any) -> None:
                # The claim takes the shared worker token; the rest its answer's lease token.
                r = await client.post(
                    f"/internal/runs/{run_id}/{action}", json=body, headers=worker
                )
                assert r.status_code == 200, r.text
                if action == "claim":
                    worker["Authorization"] = f"Bearer {r.json()['lease_token']}"

            await internal("claim", worker_id="w1")
            await internal("status", worker_id="w1", status="running")
            async with serving(app) as base, stream(base, run_id, auth) as events:
                assert (await events.take(1))[0]["data"] == {"status": "running"}
                points = [{"step": 1, "name": "loss", "value": 0.5}]
                await internal("metrics", worker_id="w1", seq=0, points=points)
                (live,) = await events.take(1)
                assert live["id"] == "1" and live["data"] == {"step": 1, "metrics": {"loss": 0.5}}
                await internal("status", worker_id="w1", status="succeeded")
                assert (await events.take(1))[0]["data"] == {"status": "succeeded"}
                assert await events.next() is None
