"""A tenant's own Tinker limits (``tenants.quota_tinker_*``, set by the operator with
``rlaas tenants quota``): they take the deployment's settings' place for that tenant only,
in the 429s (which then say it is the tenant's own limit) and in GET /v1/limits.

Over ASGI on real Postgres, as tests/app/test_tinker_limits.py (whose helpers these are):
the overrides are written by the operator's own service (app.services.tenant_quotas).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.errors import NotFound, Unprocessable
from app.services import tenant_quotas
from app.services.rate import SharedBuckets
from app.services.tinker_limits import CALLS, MODELS, TOKENS
from tests.app.conftest import Api, running_api
from tests.app.test_tinker_limits import (
    BASE,
    LIMITS,
    add_model,
    add_pending,
    bearer,
    refused,
    sample,
    tenant,
)

pytestmark = pytest.mark.anyio

CREATE = {"base_model": BASE, "lora_config": {"rank": 8}}


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    # The deployment's: 2 models per base, 2 calls in flight, 100 tokens a minute.
    async with running_api(app_database, **LIMITS) as running:
        yield running


async def override(api: Api, tenant_id: str, **changes: Any) -> None:
    """As the operator sets them (before the tenant's first call: the quota cache)."""
    await api.db(lambda s: tenant_quotas.set_quotas(s, tenant_id, changes))


def own(r: Any, limit: str, used: int, setting: str, default: int) -> dict[str, Any]:
    """A 429 at the tenant's own limit: it says so, and names the setting it replaces."""
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["quota"]["name"] == limit and error["quota"]["used"] == used
    assert error["quota"]["per_tenant"] is True
    assert error["quota"]["setting"] == f"tenants.quota_{limit}"
    assert "a per-tenant limit the operator set for this tenant" in error["message"]
    assert f"in place of the deployment's {setting}, {default}" in error["message"]
    assert int(r.headers["Retry-After"]) == error["retry_after_s"] >= 1
    return dict(error)


def frozen_tokens(api: Api) -> list[float]:
    """The token bucket's clock, held still (moved by hand, as in test_tinker_limits)."""
    now = [1_000_000.0]
    held = api.state.limits.tinker_tokens
    assert isinstance(held, SharedBuckets)
    api.state.limits.tinker_tokens = SharedBuckets(
        held.engine, clock=lambda: now[0], table="tinker_token_buckets"
    )
    return now


async def test_a_lower_override_refuses_the_tenant_at_its_own_limit(api: Api) -> None:
    auth, low = await tenant(api)
    other, at_default = await tenant(api)
    await override(api, low, tinker_calls_in_flight=1, tinker_models_per_base=1)
    mine, theirs = await add_model(api, low), await add_model(api, at_default)
    await add_pending(api, low)
    await add_pending(api, at_default)
    step = {"model_id": mine, "adam_params": {"learning_rate": 0.1}}

    r = await api.client.post("/api/v1/optim_step", json=step, headers=auth)
    error = own(r, CALLS.name, 1, CALLS.setting, 2)
    assert error["quota"]["limit"] == 1 and "1 of 1 Tinker calls in flight" in error["message"]
    # The other tenant, with as many calls in flight, is at the deployment's 2: one more goes.
    r = await api.client.post(
        "/api/v1/optim_step", json={**step, "model_id": theirs}, headers=other
    )
    assert r.status_code == 200, r.text

    # Models: the tenant's one slot on the base is full; a third tenant's, at the
    # deployment's 2, has room for a second (the other's calls in flight may be full now).
    await override(api, low, tinker_calls_in_flight=0)  # off for this tenant: past its calls
    r = await api.client.post("/api/v1/create_model", json=CREATE, headers=auth)
    error = own(r, MODELS.name, 1, MODELS.setting, 2)
    assert error["quota"]["base_model"] == BASE and r.headers["x-should-retry"] == "false"
    third, third_id = await tenant(api)
    await add_model(api, third_id)
    r = await api.client.post("/api/v1/create_model", json=CREATE, headers=third)
    assert r.status_code == 200, r.text


async def test_a_raised_override_lets_the_tenant_past_the_default(api: Api) -> None:
    frozen_tokens(api)
    auth, high = await tenant(api)
    other, at_default = await tenant(api)
    raised = {"tinker_models_per_base": 3, "tinker_calls_in_flight": 4}
    await override(api, high, **raised, tinker_tokens_per_minute=1000)
    for tenant_id in (high, at_default):
        for _ in range(2):
            await add_model(api, tenant_id)
            await add_pending(api, tenant_id)

    r = await api.client.post("/api/v1/create_model", json=CREATE, headers=auth)
    assert r.status_code == 200, r.text  # its 3rd model, its 3rd call in flight
    r = await api.client.post("/api/v1/create_model", json=CREATE, headers=other)
    # The deployment's limit, named as before: the setting, not a per-tenant one.
    error = refused(r, CALLS.name, CALLS.setting)
    assert error["quota"]["per_tenant"] is False and "per-tenant" not in error["message"]

    # 4 + 16 * 16 = 260 tokens: past the deployment's 100 a minute, within the tenant's 1000
    # (calls in flight off for both: the admitted calls' ends at the worker may lag).
    await override(api, high, tinker_calls_in_flight=0)
    await override(api, at_default, tinker_calls_in_flight=0)
    r = await api.client.post("/api/v1/asample", json=sample(16, 16), headers=auth)
    assert r.status_code == 200, r.text
    r = await api.client.post("/api/v1/asample", json=sample(16, 16), headers=auth)
    assert r.status_code == 200, r.text  # 520 of its 1000
    r = await api.client.post("/api/v1/asample", json=sample(16, 16), headers=other)
    assert r.status_code == 200, r.text  # more than a minute's: it spends a full bucket
    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=other)
    error = refused(r, TOKENS.name, TOKENS.setting)
    assert error["quota"]["limit"] == 100 and error["quota"]["per_tenant"] is False


async def test_limits_show_the_tenants_own_and_0_is_no_limit(api: Api) -> None:
    frozen_tokens(api)
    auth, tenant_id = await tenant(api)
    mine = {"tinker_models_per_base": 5, "tinker_calls_in_flight": 0}
    await override(api, tenant_id, **mine, tinker_tokens_per_minute=40)
    limits = (await api.client.get("/v1/limits", headers=bearer(auth))).json()["tinker"]
    quotas = {"models_per_base": 5, "calls_in_flight": None, "tokens_per_minute": 40}
    assert limits["quotas"] == quotas and limits["usage"]["tokens_available"] == 40
    other, _ = await tenant(api)
    limits = (await api.client.get("/v1/limits", headers=bearer(other))).json()["tinker"]
    quotas = {"models_per_base": 2, "calls_in_flight": 2, "tokens_per_minute": 100}
    assert limits["quotas"] == quotas

    # 0: the tenant has no calls-in-flight limit, as the setting's 0 would say for all.
    model_id = await add_model(api, tenant_id)
    for _ in range(3):
        await add_pending(api, tenant_id)
    step = {"model_id": model_id, "adam_params": {"learning_rate": 0.1}}
    r = await api.client.post("/api/v1/optim_step", json=step, headers=auth)
    assert r.status_code == 200, r.text

    # A tokens limit lower than the default: 4 + 16 * 2 = 36 of 40, then 36 more is refused.
    r = await api.client.post("/api/v1/asample", json=sample(16, 2), headers=auth)
    assert r.status_code == 200, r.text
    r = await api.client.post("/api/v1/asample", json=sample(16, 2), headers=auth)
    error = own(r, TOKENS.name, 36, TOKENS.setting, 100)
    assert "4 of its 40 tokens a minute left" in error["message"]
    # 32 tokens short at 40 a minute: 48 s.
    assert r.headers["Retry-After"] == "48"


async def test_bad_overrides_are_refused_naming_the_quota_and_change_nothing(api: Api) -> None:
    _, tenant_id = await tenant(api)
    await override(api, tenant_id, tinker_calls_in_flight=7)
    bad: list[tuple[dict[str, Any], str, str]] = [
        ({"tinker_calls_in_flight": -1}, "tinker_calls_in_flight", "from 0 (no limit)"),
        ({"tinker_models_per_base": 2**31}, "tinker_models_per_base", "to 2147483647"),
        ({"runs_in_flight": 0}, "runs_in_flight", "shut the tenant out"),
        ({"tinker_tokens_per_minute": 1.5}, "tinker_tokens_per_minute", "got 1.5"),
        ({"tinker_tokens_per_minute": True}, "tinker_tokens_per_minute", "got True"),
        ({"tinker_calls": 3}, "tinker_calls", "no quota named"),
        # One good, one bad: neither is set.
        ({"tinker_calls_in_flight": 3, "train_steps": -5}, "train_steps", "got -5"),
    ]
    for changes, field, says in bad:
        with pytest.raises(Unprocessable) as refusal:
            await override(api, tenant_id, **changes)
        assert refusal.value.field == field and says in refusal.value.message, changes
        assert refusal.value.status_code == 422
    tenant_row = await api.db(lambda s: tenant_quotas.find(s, tenant_id))
    assert tenant_row.quota_tinker_calls_in_flight == 7 and tenant_row.quota_train_steps is None

    with pytest.raises(NotFound) as missing:
        await override(api, "no-such-tenant", tinker_calls_in_flight=1)
    assert missing.value.field == "tenant"
