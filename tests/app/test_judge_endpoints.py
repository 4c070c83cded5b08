"""The ``judge`` reward's LLM judge through the API, on real Postgres: registered like a
webhook environment (its URL through the same address checks, its key encrypted), named
in the spec with its budget, handed to the worker with its key at claim, not deletable
while a run uses it; a judge that is not the tenant's, or a bad budget, is a 422 naming
the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.app.conftest import Api, running_api

pytestmark = pytest.mark.anyio
KEY = "sk-judge-key-0123456789abcdef"


@pytest.fixture
async def local(app_database: str) -> Any:
    async with running_api(app_database, env_url_allowlist="loopback") as api:
        yield api


async def _register(api: Api, auth: dict[str, str], url: str = "http://127.0.0.1:9/v1") -> Any:
    return await api.client.post(
        "/v1/environments", json={"name": "judge", "url": url, "secret": KEY}, headers=auth
    )


def _environment(endpoint: str, **budget: Any) -> dict[str, Any]:
    judge = {"endpoint": endpoint, "model": "gpt-x", "rubric": "correct and brief"}
    return {
        "name": "guess_number",
        "reward": "judge+env",
        "judge": {**judge, "max_calls": 50, "max_tokens": 200_000, **budget},
    }


async def test_a_judged_run_gets_its_judges_url_and_key_at_claim(local: Api) -> None:
    auth = await local.tenant()
    r = await _register(local, auth)
    assert r.status_code == 201, r.text
    judge = r.json()["id"]
    assert KEY not in r.text  # the key is never read back
    run_id = await local.submit(auth, environment=_environment(judge))
    claim = await local.internal(run_id, "claim", worker_id="w1")
    assert claim.status_code == 200, claim.text
    grant = claim.json()["judge"]
    assert grant["id"] == judge and grant["secret"] == KEY
    assert grant["url"] == "http://127.0.0.1:9/v1"
    assert claim.json()["scorer"] is None and claim.json()["environment"] is None
    r = await local.client.delete(f"/v1/environments/{judge}", headers=auth)
    assert r.status_code == 409 and run_id in r.json()["error"]["message"]


async def test_a_judge_not_the_tenants_or_a_bad_budget_is_422_naming_the_field(
    local: Api,
) -> None:
    owner, other = await local.tenant(), await local.tenant()
    judge = (await _register(local, owner)).json()["id"]

    async def submit(env: dict[str, Any], auth: dict[str, str]) -> dict[str, Any]:
        r = await local.client.post(
            "/v1/runs", json={"spec": {"environment": env, "train": {"steps": 3}}}, headers=auth
        )
        assert r.status_code == 422, r.text
        return dict(r.json()["error"])

    for env in (_environment(judge), _environment("env_0123abcd")):
        error = await submit(env, other)
        assert error["field"] == "spec.environment.judge.endpoint"
        assert "register one with POST /v1/environments" in error["message"]
    assert (await submit(_environment(judge, max_calls=0), owner))["field"] == (
        "spec.environment.judge.max_calls"
    )
    assert (await submit(_environment(judge, max_tokens=-5), owner))["field"] == (
        "spec.environment.judge.max_tokens"
    )
    missing = await submit({"name": "guess_number", "reward": "judge"}, owner)
    assert "environment.judge" in missing["message"]


async def test_a_judge_on_a_loopback_address_is_refused_where_webhooks_are(
    app_database: str,
) -> None:
    async with running_api(app_database, env_url_allowlist="public") as api:
        auth = await api.tenant()
        for url in ("http://127.0.0.1:8000/v1", "http://10.1.2.3/v1"):
            r = await _register(api, auth, url)
            assert r.status_code == 422 and r.json()["error"]["field"] == "url", r.text
