"""Submitting runs of the ecosystem kinds on real Postgres: ``reasoning_gym`` and ``openenv``
configs refused with the field named; an ``openenv`` run's registered server is checked,
handed to the claim like a webhook's, and kept while the run is unfinished."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, running_api
from tests.app.test_environments import SECRET, register

pytestmark = pytest.mark.anyio


@pytest.fixture
async def loopback_api(app_database: str) -> Any:
    async with running_api(app_database, env_url_allowlist="public,loopback") as running:
        yield running


async def refused(api: Api, auth: dict[str, str], environment: dict[str, Any]) -> dict[str, Any]:
    r = await api.client.post("/v1/runs", json={"spec": {"environment": environment}}, headers=auth)
    assert r.status_code == 422, r.text
    return dict(r.json()["error"])


async def test_reasoning_gym_configs_are_checked_at_submit(loopback_api: Api) -> None:
    api = loopback_api
    auth = await api.tenant()
    unknown = await refused(
        api, auth, {"name": "reasoning_gym", "config": {"dataset": "basic_arithmetc"}}
    )
    assert unknown["field"] == "spec.environment.config.dataset"
    assert "unknown reasoning-gym dataset 'basic_arithmetc'" in unknown["message"]
    assert "basic_arithmetic" in unknown["message"]  # the known ones are listed
    ours = await refused(
        api,
        auth,
        {"name": "reasoning_gym", "config": {"dataset": "gcd", "dataset_config": {"size": 9}}},
    )
    assert ours["field"] == "spec.environment.config.dataset_config"
    assert "config.size" in ours["message"]
    run_id = await api.submit(
        auth, environment={"name": "reasoning_gym", "config": {"dataset": "gcd", "size": 100}}
    )
    claim = await api.internal(run_id, "claim", worker_id="w1")
    assert claim.status_code == 200 and claim.json()["environment"] is None  # no server


async def test_openenv_runs_name_a_registered_server(loopback_api: Api) -> None:
    api = loopback_api
    auth = await api.tenant()
    unregistered = await refused(
        api, auth, {"name": "openenv", "config": {"environment": "env_deadbeef"}}
    )
    assert unregistered["field"] == "spec.environment.config.environment"
    assert "POST /v1/environments" in unregistered["message"]
    missing = await refused(api, auth, {"name": "openenv", "config": {}})
    assert missing["field"] == "spec.environment.config"
    assert "environment (env_<id> of a registered one)" in missing["message"]
    local = await refused(api, auth, {"name": "openenv", "config": {"url": "http://127.0.0.1:9/"}})
    assert local["field"] == "spec.environment.config.url"
    assert "POST /v1/environments" in local["message"]
    bad_mode = await refused(
        api, auth, {"name": "openenv", "config": {"environment": "env_x", "action_mode": "json"}}
    )
    assert bad_mode["field"] == "spec.environment.config.action_mode"

    env = await register(api, auth, name="say-server")
    config = {"environment": env["id"], "action_field": "message"}
    run_id = await api.submit(auth, environment={"name": "openenv", "config": config})
    claim = await api.internal(run_id, "claim", worker_id="w1")
    assert claim.status_code == 200, claim.text
    # The same grant a webhook's run gets: its URL (checked at registration) and secret.
    assert claim.json()["environment"] == {
        "id": env["id"],
        "url": env["url"],
        "secret": SECRET,
        "timeout_s": 5.0,
        "max_concurrency": 4,
    }
    busy = await api.client.delete(f"/v1/environments/{env['id']}", headers=auth)
    assert busy.status_code == 409 and run_id in busy.json()["error"]["message"]
