"""The embedded default: the whole path on SQLite files under one data folder, no servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from app.admin import create_tenant, migrate
from app.db.models import EnvCallback
from app.dispatch import RecordingDispatcher
from app.main import create_app, reap_once
from app.settings import Settings
from rl_core.protocol.signing import HEADER, sign
from tests.app.conftest import spec

pytestmark = pytest.mark.anyio


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("RLAAS_DATABASE_URL", "RLAAS_BROKER_URL", "RLAAS_WORKER_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(data_dir=tmp_path / "rlaas", reaper_interval_s=3600)
    migrate(settings)  # synchronous: Alembic runs its own event loop
    return settings


@pytest.fixture
async def client(embedded: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(embedded, dispatcher=RecordingDispatcher())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as http:
            yield http


async def test_submit_claim_report_and_read_back_on_sqlite(
    embedded: Settings, client: httpx.AsyncClient
) -> None:
    _, key = await create_tenant(embedded, "local")
    auth = {"Authorization": f"Bearer {key}", "Idempotency-Key": "once"}
    token = (embedded.data_dir / "worker_token").read_text().strip()  # what a local worker reads
    worker = {"Authorization": f"Bearer {token}"}

    created = await client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    again = await client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert again.status_code == 200 and again.json()["id"] == run_id

    async def internal(action: str, **body: object) -> httpx.Response:
        # The claim with the shared worker token; the rest with the claim's lease token.
        headers = worker if action == "claim" else held
        r = await client.post(f"/internal/runs/{run_id}/{action}", json=body, headers=headers)
        assert r.status_code == 200, r.text
        if action == "claim":
            held["Authorization"] = f"Bearer {r.json()['lease_token']}"
        return r

    held: dict[str, str] = {}
    # As a worker claims: fairly between tenants (one tenant here; the run is its only one).
    assert (await internal("claim", worker_id="w1", fair=True)).json()["run_id"] == run_id
    await internal("status", worker_id="w1", status="running")
    points = [{"step": s, "name": "reward/mean", "value": s / 4} for s in (1, 2)]
    await internal("metrics", worker_id="w1", seq=0, points=points)
    duplicate = await internal("metrics", worker_id="w1", seq=0, points=points)
    assert duplicate.json() == {"accepted": 0, "duplicate": True}
    # The upsert on SQLite: a point sent again in a later batch overwrites.
    await internal("metrics", worker_id="w1", seq=1, points=[{**points[1], "value": 0.9}])
    await internal("status", worker_id="w1", status="succeeded")

    run = (await client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "succeeded" and run["current_step"] == 2
    metrics = (await client.get(f"/v1/runs/{run_id}/metrics", headers=auth)).json()
    assert [(p["step"], p["value"]) for p in metrics["points"]] == [(1, 0.25), (2, 0.9)]
    events = (await client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert [e["to_status"] for e in events] == ["queued", "starting", "running", "succeeded"]
    # SQLite keeps no zone; the API still says UTC.
    assert datetime.fromisoformat(run["created_at"]).utcoffset() == timedelta(0)
    # The run-seconds of the compute budget are read from the events on SQLite too.
    limits = (await client.get("/v1/limits", headers=auth)).json()
    assert limits["usage"]["run_seconds"] >= 0 and limits["usage"]["runs_in_flight"] == 0

    plain_auth = {"Authorization": auth["Authorization"]}
    newer = [
        (await client.post("/v1/runs", json={"spec": spec()}, headers=plain_auth)).json()["id"]
        for _ in range(2)
    ]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/runs", params=params, headers=plain_auth)).json()
        seen += [r["id"] for r in page["items"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == [*reversed(newer), run_id]


async def test_a_deferred_result_is_taken_once_and_swept_on_sqlite(embedded: Settings) -> None:
    # The callback rows' SQL on SQLite: the upsert of the worker's poll, the conditional
    # UPDATE ... RETURNING of the post, and the sweep's correlated DELETE.
    app = create_app(embedded, dispatcher=RecordingDispatcher())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as client:
            _, key = await create_tenant(embedded, "local")
            auth = {"Authorization": f"Bearer {key}"}
            token = (embedded.data_dir / "worker_token").read_text().strip()
            worker = {"Authorization": f"Bearer {token}"}
            secret = "embedded-secret-0123456789"
            env = await client.post(
                "/v1/environments",
                json={"name": "local", "url": "http://127.0.0.1:9/env", "secret": secret},
                headers=auth,
            )
            assert env.status_code == 201, env.text
            environment = {"name": env.json()["id"]}
            created = await client.post(
                "/v1/runs", json={"spec": spec(environment=environment)}, headers=auth
            )
            run_id = created.json()["id"]
            claim = f"/internal/runs/{run_id}/claim"
            claimed = await client.post(claim, json={"worker_id": "w1"}, headers=worker)
            assert claimed.is_success, claimed.text
            held = {"Authorization": f"Bearer {claimed.json()['lease_token']}"}
            episode = f"{run_id}~a1-g0-e0"
            waited = f"/internal/runs/{run_id}/env-callbacks/{episode}/1"
            assert (await client.get(waited, params={"wait_s": 0}, headers=held)).status_code == 204
            raw = json.dumps({"episode_id": episode, "step": 1, "reward": 1.0, "done": True})
            headers = {HEADER: sign(secret, raw.encode()), "Content-Type": "application/json"}
            url = f"/v1/env-callbacks/{episode}/1"
            assert (await client.post(url, content=raw, headers=headers)).status_code == 202
            assert (await client.post(url, content=raw, headers=headers)).status_code == 409
            got = await client.get(waited, params={"wait_s": 0}, headers=held)
            assert got.json()["body"]["reward"] == 1.0

            for status in ("running", "succeeded"):
                body = {"worker_id": "w1", "status": status}
                ended = await client.post(
                    f"/internal/runs/{run_id}/status", json=body, headers=held
                )
                assert ended.is_success, ended.text
            await reap_once(app.state.rlaas)
            assert (await client.post(url, content=raw, headers=headers)).status_code == 410
            async with app.state.rlaas.sessions() as session:
                assert (await session.scalars(select(EnvCallback))).all() == []


async def test_a_workers_report_is_kept_and_replaced_on_sqlite(
    embedded: Settings, client: httpx.AsyncClient
) -> None:
    token = (embedded.data_dir / "worker_token").read_text().strip()
    worker = {"Authorization": f"Bearer {token}"}
    for wall, tenant_code in (("bwrap", "runs"), ("audit", "runs_on_weak_wall")):
        body = {
            "worker_id": "w1",
            "queue": "cpu",
            "sandbox": {"wall": wall, "tenant_code": tenant_code},
        }
        r = await client.post("/internal/workers/report", json=body, headers=worker)
        assert r.status_code == 200, r.text
    workers = (await client.get("/readyz")).json()["workers"]
    assert [(w["worker_id"], w["sandbox_wall"], w["tenant_code"]) for w in workers] == [
        ("w1", "audit", "runs_on_weak_wall")
    ]
