"""The Tinker-compatible API's limits per tenant (app.services.tinker_limits): models per
base, calls in flight, tokens per minute. Each is a 429 with Retry-After, naming the limit,
the use and the setting; another tenant is not held by it; a freed slot admits again.

Over ASGI on real Postgres with a worker URL that nothing listens on: the calls admitted
here fail at the worker afterwards, which is no matter to their admission. Slots are
filled with rows where a real worker would be needed to hold them (models, pending calls).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from app.db.models import TinkerFuture, TinkerModel, utcnow
from app.services.rate import SharedBuckets
from app.services.tenants import authenticate
from app.services.tinker import new_id
from tests.app.conftest import Api, running_api

pytestmark = pytest.mark.anyio

BASE = "builtin:tiny"
LIMITS = {
    "tinker_worker_url": "http://127.0.0.1:9",
    "tinker_worker_token": "s3cret",
    "tinker_max_models_per_base": 2,
    "tinker_max_calls_in_flight": 2,
    "tinker_tokens_per_minute": 100,
}


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    async with running_api(app_database, **LIMITS) as running:
        yield running


async def tenant(api: Api) -> tuple[dict[str, str], str]:
    """A new tenant's X-API-Key header (the SDK's form) and its id."""
    key = (await api.tenant())["Authorization"].removeprefix("Bearer ")
    tenant_id = await api.db(lambda s: authenticate(s, key))
    return {"X-API-Key": f"tml-{key}"}, tenant_id


async def add_model(api: Api, tenant_id: str, base: str = BASE) -> str:
    model_id = new_id("tm")

    async def add(session: Any) -> None:
        session.add(TinkerModel(id=model_id, tenant_id=tenant_id, base_model=base, lora_rank=8))

    await api.db(add)
    return model_id


async def add_pending(api: Api, tenant_id: str, age: timedelta = timedelta(0)) -> str:
    """A call in flight, as a process making it leaves it (``age`` old)."""
    future_id = new_id("tf")

    async def add(session: Any) -> None:
        session.add(
            TinkerFuture(
                id=future_id,
                tenant_id=tenant_id,
                kind="forward_backward",
                state="pending",
                created_at=utcnow() - age,
            )
        )

    await api.db(add)
    return future_id


def refused(r: httpx.Response, name: str, setting: str) -> dict[str, Any]:
    """The 429's body, checked: Retry-After, the limit named with its use and setting."""
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["quota"]["name"] == name and error["quota"]["setting"] == setting
    assert setting in error["message"]
    assert int(r.headers["Retry-After"]) == error["retry_after_s"] >= 1
    return dict(error)


def sample(max_tokens: int, num_samples: int) -> dict[str, Any]:
    """An asample body on the base: a 4-token prompt."""
    return {
        "base_model": BASE,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]},
        "num_samples": num_samples,
        "sampling_params": {"max_tokens": max_tokens},
    }


def forward_backward(model_id: str, tokens: int) -> bytes:
    """A ForwardBackwardRequest (protobuf) with one datum of ``tokens`` input tokens."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    text = field(1, struct.pack(f"<{tokens}i", *range(tokens)))
    datum = field(1, field(1, text))
    return field(1, model_id.encode()) + field(3, datum) + field(4, b"cross_entropy")


async def test_models_per_base_is_429_until_one_is_unloaded(api: Api) -> None:
    auth, tenant_id = await tenant(api)
    first = await add_model(api, tenant_id)
    await add_model(api, tenant_id)
    await add_model(api, tenant_id, base="pkg:other")  # another base's slots are its own
    create = {"base_model": BASE, "lora_config": {"rank": 8}}

    r = await api.client.post("/api/v1/create_model", json=create, headers=auth)
    error = refused(r, "tinker_models_per_base", "RLAAS_TINKER_MAX_MODELS_PER_BASE")
    assert error["quota"] == {**error["quota"], "limit": 2, "used": 2, "base_model": BASE}
    assert "unload_model" in error["message"]
    # Waiting frees no model slot: the SDK is told not to retry (it raises the message).
    assert r.headers["x-should-retry"] == "false"

    other, _ = await tenant(api)
    r = await api.client.post("/api/v1/create_model", json=create, headers=other)
    assert r.status_code == 200, r.text

    r = await api.client.post("/api/v1/unload_model", json={"model_id": first}, headers=auth)
    assert r.status_code == 200 and r.json()["model_id"] == first
    assert await api.db(lambda s: s.get(TinkerModel, first)) is None
    r = await api.client.post("/api/v1/unload_model", json={"model_id": first}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["field"] == "model_id"
    r = await api.client.post("/api/v1/create_model", json=create, headers=auth)
    assert r.status_code == 200, r.text


async def test_another_tenants_model_cannot_be_unloaded(api: Api) -> None:
    _, owner = await tenant(api)
    model_id = await add_model(api, owner)
    other, _ = await tenant(api)
    r = await api.client.post("/api/v1/unload_model", json={"model_id": model_id}, headers=other)
    assert r.status_code == 404
    assert await api.db(lambda s: s.get(TinkerModel, model_id)) is not None


async def test_calls_in_flight_are_429_until_one_finishes(api: Api) -> None:
    auth, tenant_id = await tenant(api)
    model_id = await add_model(api, tenant_id)
    first = await add_pending(api, tenant_id)
    await add_pending(api, tenant_id)
    # A pending call no process makes any more (older than any call's timeout) holds no slot.
    await add_pending(api, tenant_id, age=timedelta(hours=1))
    step = {"model_id": model_id, "adam_params": {"learning_rate": 0.1}}

    r = await api.client.post("/api/v1/optim_step", json=step, headers=auth)
    error = refused(r, "tinker_calls_in_flight", "RLAAS_TINKER_MAX_CALLS_IN_FLIGHT")
    assert error["quota"]["used"] == 2 and error["quota"]["limit"] == 2
    assert r.headers["Retry-After"] == "1"
    r = await api.client.post("/api/v1/asample", json=sample(4, 1), headers=auth)
    assert r.status_code == 429  # every work call counts, and is held by it

    other, other_id = await tenant(api)
    theirs = await add_model(api, other_id)
    r = await api.client.post(
        "/api/v1/optim_step", json={**step, "model_id": theirs}, headers=other
    )
    assert r.status_code == 200, r.text

    # The limits a tenant reads: its use of each.
    limits = (await api.client.get("/v1/limits", headers=bearer(auth))).json()["tinker"]
    quotas = {"models_per_base": 2, "calls_in_flight": 2, "tokens_per_minute": 100}
    assert limits["quotas"] == quotas
    assert limits["usage"]["calls_in_flight"] == 2 and limits["usage"]["models"] == {BASE: 1}

    await api.db(
        lambda s: s.execute(
            update(TinkerFuture).where(TinkerFuture.id == first).values(state="done")
        )
    )
    r = await api.client.post("/api/v1/optim_step", json=step, headers=auth)
    assert r.status_code == 200, r.text


async def test_tokens_per_minute_are_429_until_the_bucket_refills(app_database: str) -> None:
    # Calls in flight off: the admitted calls' failures at the worker may lag the next call.
    async with running_api(app_database, **{**LIMITS, "tinker_max_calls_in_flight": 0}) as api:
        await tokens_per_minute(api)


async def tokens_per_minute(api: Api) -> None:
    # The bucket's clock, moved by hand: as the API processes' wall clock would move.
    now = [1_000_000.0]
    held = api.state.limits.tinker_tokens
    assert isinstance(held, SharedBuckets)  # kept in Postgres, shared by every process
    api.state.limits.tinker_tokens = SharedBuckets(
        held.engine, clock=lambda: now[0], table="tinker_token_buckets"
    )
    auth, tenant_id = await tenant(api)
    model_id = await add_model(api, tenant_id)
    proto = {**auth, "Content-Type": "application/x-protobuf"}

    # 4 + 16 * 4 = 68 of the 100 tokens; then 20 of forward_backward data: 12 are left.
    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=auth)
    assert r.status_code == 200, r.text
    body = forward_backward(model_id, 20)
    r = await api.client.post("/api/v1/forward_backward", content=body, headers=proto)
    assert r.status_code == 200, r.text

    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=auth)
    error = refused(r, "tinker_tokens_per_minute", "RLAAS_TINKER_TOKENS_PER_MINUTE")
    assert error["quota"]["used"] == 88 and "68 tokens" in error["message"]
    # 56 tokens short at 100 a minute: 33.6 s, rounded up.
    assert r.headers["Retry-After"] == "34"
    r = await api.client.post("/api/v1/forward_backward", content=body, headers=proto)
    assert r.status_code == 429  # forward_backward's tokens are held by the same bucket

    other, _ = await tenant(api)
    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=other)
    assert r.status_code == 200, r.text

    now[0] += 33.0  # not quite
    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=auth)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    now[0] += 1.0
    r = await api.client.post("/api/v1/asample", json=sample(16, 4), headers=auth)
    assert r.status_code == 200, r.text

    # A call of more tokens than a minute's waits for a full bucket rather than never passing.
    now[0] += 60.0
    r = await api.client.post("/api/v1/asample", json=sample(64, 4), headers=auth)
    assert r.status_code == 200, r.text
    limits = (await api.client.get("/v1/limits", headers=bearer(auth))).json()["tinker"]
    assert limits["usage"]["tokens_available"] == 0


async def test_a_setting_of_0_turns_its_limit_off(app_database: str) -> None:
    off = {**LIMITS, "tinker_max_models_per_base": 0, "tinker_tokens_per_minute": 0}
    async with running_api(app_database, **off) as api:
        auth, tenant_id = await tenant(api)
        for _ in range(3):
            await add_model(api, tenant_id)
        r = await api.client.post("/api/v1/create_model", json={"base_model": BASE}, headers=auth)
        assert r.status_code == 200, r.text
        r = await api.client.post("/api/v1/asample", json=sample(4096, 64), headers=auth)
        assert r.status_code == 200, r.text
        limits = (await api.client.get("/v1/limits", headers=bearer(auth))).json()["tinker"]
        assert limits["quotas"]["models_per_base"] is None
        assert limits["usage"]["tokens_available"] is None


def bearer(auth: dict[str, str]) -> dict[str, str]:
    return {"Authorization": "Bearer " + auth["X-API-Key"].removeprefix("tml-")}


async def test_calls_racing_at_the_limit_are_admitted_no_more_than_it(app_database: str) -> None:
    """Five calls at once, two slots: the tenant's row lock lets exactly two through. The
    worker accepts connections and never answers, so the admitted calls stay in flight."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        silent_worker = {"tinker_worker_url": url, "tinker_worker_token": "s3cret"}
        async with running_api(app_database, **{**LIMITS, **silent_worker}) as api:
            auth, tenant_id = await tenant(api)
            model_id = await add_model(api, tenant_id)
            step = {"model_id": model_id, "adam_params": {"learning_rate": 0.1}}
            answers = await asyncio.gather(
                *(api.client.post("/api/v1/optim_step", json=step, headers=auth) for _ in range(5))
            )
            assert sorted(r.status_code for r in answers) == [200, 200, 429, 429, 429]
            limits = (await api.client.get("/v1/limits", headers=bearer(auth))).json()["tinker"]
            assert limits["usage"]["calls_in_flight"] == 2
