"""The ``webhook`` reward's scorer endpoint through the API, on real Postgres: a spec names
one of the tenant's registered endpoints (``environment.scorer``), the claim hands it
to the worker with its secret, and it cannot be deleted while a run uses it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, running_api

pytestmark = pytest.mark.anyio
SECRET = "scorer-secret-0123456789abcdef"


@pytest.fixture
async def local(app_database: str) -> Any:
    async with running_api(app_database, env_url_allowlist="loopback") as api:
        yield api


async def _register(api: Api, auth: dict[str, str], name: str = "judge") -> str:
    r = await api.client.post(
        "/v1/environments",
        json={"name": name, "url": "http://127.0.0.1:9/scorer", "secret": SECRET},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _environment(scorer: str) -> dict[str, Any]:
    return {"name": "guess_number", "reward": "webhook+env", "scorer": scorer}


async def test_a_run_scored_by_a_registered_endpoint_gets_its_grant_at_claim(local: Api) -> None:
    auth = await local.tenant()
    scorer = await _register(local, auth)
    run_id = await local.submit(auth, environment=_environment(scorer))
    claim = await local.internal(run_id, "claim", worker_id="w1")
    assert claim.status_code == 200, claim.text
    grant = claim.json()["scorer"]
    assert grant["id"] == scorer and grant["secret"] == SECRET
    assert grant["url"] == "http://127.0.0.1:9/scorer"
    assert claim.json()["environment"] is None  # guess_number is a built-in
    # Used by an unfinished run: not deletable, as an environment in use is not.
    r = await local.client.delete(f"/v1/environments/{scorer}", headers=auth)
    assert r.status_code == 409 and run_id in r.json()["error"]["message"]


async def test_a_scorer_that_is_not_the_tenants_is_422_naming_the_field(local: Api) -> None:
    owner, other = await local.tenant(), await local.tenant()
    scorer = await _register(local, owner)
    for env in (_environment(scorer), _environment("env_0123abcd")):
        r = await local.client.post(
            "/v1/runs", json={"spec": {"environment": env, "train": {"steps": 3}}}, headers=other
        )
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == "spec.environment.scorer"
        assert "register one with POST /v1/environments" in r.json()["error"]["message"]
    # The webhook reward without a scorer: refused, saying what to add.
    r = await local.client.post(
        "/v1/runs",
        json={"spec": {"environment": {"name": "guess_number", "reward": "webhook"}}},
        headers=owner,
    )
    assert r.status_code == 422 and "environment.scorer" in r.text
