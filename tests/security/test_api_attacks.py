"""Attacks on the public API by a tenant with a key, or a stranger with none.

Each is one hostile request (or short sequence) against the real app on PostgreSQL, and
asserts the refusal, what the answer names, and that nothing was stored. A DNS name
re-pointed after registration is the worker's to refuse, at connection time:
tests/rl_core/envs/test_connect_check.py plays it (and test_check_rebinding.py here the
control plane's own check).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.db.models import Run
from tests.app.conftest import Api, running_api
from tests.app.test_runs import count

pytestmark = pytest.mark.anyio
ENV = '{"environment": {"name": "guess_number"}'  # a spec's start, left open


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    async with running_api(app_database) as running:
        yield running


async def submit_raw(api: Api, auth: dict[str, str], spec_json: str) -> httpx.Response:
    body = f'{{"spec": {spec_json}}}'.encode()
    headers = {**auth, "Content-Type": "application/json"}
    return await api.client.post("/v1/runs", content=body, headers=headers)


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999"])
async def test_a_non_finite_number_in_a_spec_is_refused_naming_its_field(
    api: Api, number: str
) -> None:
    auth = await api.tenant()
    spec = ENV + ', "algorithm": {"entropy_coef": ' + number + "}}"
    r = await submit_raw(api, auth, spec)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "spec.algorithm.entropy_coef", r.text
    assert await count(api, Run) == 0


async def test_a_10_mb_string_in_a_spec_is_refused_before_it_is_read(api: Api) -> None:
    auth = await api.tenant()
    prompt = "x" * (10 * 2**20)
    spec = ENV + ', "agent": {"system_prompt": "' + prompt + '"}}'
    r = await submit_raw(api, auth, spec)
    assert r.status_code == 413, r.text[:300]
    error = r.json()["error"]
    assert error["field"] == "body" and error["limit_bytes"] < 10 * 2**20
    assert await count(api, Run) == 0


@pytest.mark.parametrize(
    "source",
    ["gguf:/etc/passwd", "hf:../../../../root/.ssh", "gguf:models/../../../etc/shadow.gguf"],
)
async def test_a_model_path_outside_the_models_folder_is_refused(api: Api, source: str) -> None:
    auth = await api.tenant()
    spec = ENV + ', "model": {"source": "' + source + '"}}'
    r = await submit_raw(api, auth, spec)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "spec.model.source" and "models folder" in error["message"], error
    assert await count(api, Run) == 0


async def test_metrics_without_credentials_from_another_host_are_refused(api: Api) -> None:
    stranger = httpx.ASGITransport(app=api.app, client=("198.51.100.7", 51000))
    async with httpx.AsyncClient(transport=stranger, base_url="http://rlaas.test") as client:
        r = await client.get("/metrics")
    assert r.status_code == 403, r.text
    assert "rlaas_http_requests_total" not in r.text


async def test_a_key_revoked_over_the_api_opens_nothing(api: Api) -> None:
    old = await api.tenant()
    assert (await api.client.get("/v1/runs", headers=old)).status_code == 200  # remembered
    created = await api.client.post("/v1/keys", headers=old)
    assert created.status_code == 201, created.text
    new = {"Authorization": f"Bearer {created.json()['key']}"}
    keys = (await api.client.get("/v1/keys", headers=new)).json()["items"]
    (old_id,) = [k["id"] for k in keys if k["id"] != created.json()["id"]]
    revoked = await api.client.delete(f"/v1/keys/{old_id}", headers=new)
    assert revoked.status_code == 200, revoked.text
    for _ in range(2):  # at once, though the key was verified moments ago; and again
        r = await api.client.get("/v1/runs", headers=old)
        assert r.status_code == 401, r.text
    r = await api.client.post("/v1/runs", json={"spec": {}}, headers=old)
    assert r.status_code == 401
    assert (await api.client.get("/v1/runs", headers=new)).status_code == 200
