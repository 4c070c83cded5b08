"""The Tinker-compatible routes' refusals: each names what to change (docs/tinker.md).

Over ASGI with a worker URL that nothing listens on: every case here is refused before
a call would reach it.
"""

from __future__ import annotations

import pytest

from app.db.models import TinkerWorker
from app.services import worker_credentials
from tests.app.conftest import WORKER, Api, running_api, tml

pytestmark = pytest.mark.anyio


@pytest.fixture
def api(tinker_api: Api) -> Api:
    return tinker_api


async def test_a_key_is_needed_and_the_tml_prefix_is_dropped(api: Api) -> None:
    r = await api.client.post("/api/v1/create_session", json={})
    assert r.status_code == 401 and r.json()["error"]["field"] == "X-API-Key"
    r = await api.client.post(
        "/api/v1/create_session", json={}, headers={"X-API-Key": "tml-rlaas_nope_nope"}
    )
    assert r.status_code == 401
    r = await api.client.post("/api/v1/create_session", json={}, headers=await tml(api))
    assert r.status_code == 200 and r.json()["session_id"].startswith("tss_")


async def test_create_model_names_the_bad_field(api: Api) -> None:
    auth = await tml(api)
    r = await api.client.post(
        "/api/v1/create_model", json={"base_model": "Qwen/Qwen3-8B"}, headers=auth
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "base_model"
    assert "builtin:tiny" in r.json()["error"]["message"]
    r = await api.client.post(
        "/api/v1/create_model",
        json={"base_model": "builtin:tiny", "lora_config": {"rank": 0}},
        headers=auth,
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "lora_config.rank"


async def test_forward_backward_takes_protobuf_and_reads_it_carefully(api: Api) -> None:
    auth = await tml(api)
    r = await api.client.post("/api/v1/forward_backward", json={}, headers=auth)
    assert r.status_code == 400 and "protobuf" in r.json()["error"]["message"]
    proto = {**auth, "Content-Type": "application/x-protobuf"}
    r = await api.client.post("/api/v1/forward_backward", content=b"\x0a\xff", headers=proto)
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"
    # model_id "x", loss_fn "cross_entropy", no such model: 404, not another tenant's.
    body = b"\x0a\x01x" + b"\x22\x0dcross_entropy"
    r = await api.client.post("/api/v1/forward_backward", content=body, headers=proto)
    assert r.status_code == 404 and r.json()["error"]["field"] == "model_id"


async def test_unknown_futures_samplers_and_paths_are_404(api: Api) -> None:
    auth = await tml(api)
    r = await api.client.post("/api/v1/retrieve_future", json={"request_id": "tf_x"}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["field"] == "request_id"
    r = await api.client.get("/api/v1/samplers/ts_x", headers=auth)
    assert r.status_code == 404
    r = await api.client.post(
        "/api/v1/create_sampling_session",
        json={"model_path": "tinker://tm_x/sampler_weights/a"},
        headers=auth,
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "model_path"
    r = await api.client.post(
        "/api/v1/asample",
        json={"base_model": "builtin:tiny", "prompt": {"chunks": []}, "sampling_params": {}},
        headers=auth,
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "prompt"


async def test_without_a_worker_work_calls_say_how_to_get_one(app_database: str) -> None:
    async with running_api(app_database) as api:
        r = await api.client.post(
            "/api/v1/create_model", json={"base_model": "builtin:tiny"}, headers=await tml(api)
        )
        assert r.status_code == 503 and "RLAAS_TINKER_WORKER_URL" in r.json()["error"]["message"]


async def test_workers_register_with_their_credential_and_models_follow_them(
    app_database: str,
) -> None:
    async with running_api(app_database) as api:
        auth = await tml(api)
        worker = {"url": "http://127.0.0.1:9", "token": "s3cret", "bases": ["builtin:tiny"]}
        r = await api.client.post("/internal/tinker/workers", json=worker)
        assert r.status_code == 401
        r = await api.client.post(
            "/internal/tinker/workers", json={**worker, "url": "ftp://x"}, headers=WORKER
        )
        assert r.status_code == 422 and r.json()["error"]["field"] == "url"
        r = await api.client.post("/internal/tinker/workers", json=worker, headers=WORKER)
        assert r.status_code == 201
        worker_id = r.json()["id"]
        r = await api.client.get("/api/v1/get_server_capabilities", headers=auth)
        assert [m["model_name"] for m in r.json()["supported_models"]] == ["builtin:tiny"]

        r = await api.client.post(
            "/api/v1/create_model", json={"base_model": "builtin:tiny"}, headers=auth
        )
        assert r.status_code == 200
        model_id = r.json()["model_id"]
        r = await api.client.delete(f"/internal/tinker/workers/{worker_id}", headers=WORKER)
        assert r.status_code == 204
        # Its weights went with the worker: the client is told to start again, not to wait.
        r = await api.client.post(
            "/api/v1/optim_step",
            json={"model_id": model_id, "adam_params": {"learning_rate": 0.1}},
            headers=auth,
        )
        assert r.status_code == 410 and r.json()["error"]["field"] == "model_id"


async def test_a_worker_cannot_withdraw_another_workers_registration(api: Api) -> None:
    """A registration is withdrawn only with the credential that made it: another worker's
    (here, the shared token) is told there is no such worker, and the models stay reachable."""
    row, credential = await api.db(lambda s: worker_credentials.issue(s, "tinker-1"))
    mine = {"Authorization": f"Bearer {credential}"}
    worker = {"url": "http://127.0.0.1:9", "token": "s3cret", "bases": ["builtin:tiny"]}
    r = await api.client.post("/internal/tinker/workers", json=worker, headers=mine)
    assert r.status_code == 201
    worker_id = r.json()["id"]
    stored = await api.db(lambda s: s.get(TinkerWorker, worker_id))
    assert stored is not None and stored.credential_id == row.id

    r = await api.client.delete(f"/internal/tinker/workers/{worker_id}", headers=WORKER)
    assert r.status_code == 404 and r.json()["error"]["field"] == "worker_id"
    assert await api.db(lambda s: s.get(TinkerWorker, worker_id)) is not None
    r = await api.client.delete(f"/internal/tinker/workers/{worker_id}", headers=mine)
    assert r.status_code == 204


async def test_a_static_worker_url_without_its_secret_stops_start_up_naming_both() -> None:
    from pydantic import ValidationError

    from app.settings import Settings

    with pytest.raises(ValidationError, match="RLAAS_TINKER_WORKER_TOKEN is not"):
        Settings(tinker_worker_url="http://127.0.0.1:8500")
    assert Settings(tinker_worker_url="http://x:1", tinker_worker_token="t").tinker_worker_token
