"""Per-tenant quotas on real Postgres: runs in flight, request rate, body size; GET /v1/limits."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.errors import TooManyRequests
from app.services import quotas
from app.services.quotas import Limiter
from app.services.rate import SharedBuckets, TokenBucket
from app.settings import Settings
from tests.app.conftest import Api, lease, running_api, set_quota, spec

pytestmark = pytest.mark.anyio


async def test_limits_show_the_defaults_then_the_overrides_and_the_use(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.get("/v1/limits", headers=auth)
    assert r.status_code == 200
    settings = api.state.settings
    assert r.json()["quotas"] == {
        "runs_in_flight": settings.quota_runs_in_flight,
        "requests_per_minute": settings.quota_requests_per_minute,
        "body_bytes": settings.quota_body_bytes,
        "run_seconds": None,  # no compute budget by default (tests/app/test_budget.py)
        "run_seconds_period_s": settings.quota_run_seconds_period_s,
        "train_steps": None,
        "dataset_bytes": settings.quota_dataset_bytes,
        "artifact_bytes": settings.quota_artifact_bytes,
    }
    await api.submit(auth)
    # Six requests a minute: one comes back every 10 s, so the GET's own use still shows on
    # a slow machine (at the default 1,200, 0.05 s between requests refills the bucket).
    await set_quota(api, auth, runs_in_flight=5, body_bytes=4096, requests_per_minute=6)
    # Drop the 10 s quota cache (the shared request bucket stays).
    api.state.limits = Limiter(settings, buckets=api.state.limits.buckets)
    body = (await api.client.get("/v1/limits", headers=auth)).json()
    assert body["quotas"]["runs_in_flight"] == 5 and body["quotas"]["body_bytes"] == 4096
    assert body["usage"]["runs_in_flight"] == 1
    assert 0 < body["usage"]["requests_available"] < 6


async def test_runs_in_flight_over_quota_is_429_and_a_replay_still_answers(api: Api) -> None:
    auth = await api.tenant()
    await set_quota(api, auth, runs_in_flight=2)
    first = await api.client.post(
        "/v1/runs", json={"spec": spec()}, headers={**auth, "Idempotency-Key": "k1"}
    )
    await api.submit(auth)
    over = await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert over.status_code == 429
    assert over.headers["Retry-After"] == str(api.state.settings.runs_in_flight_retry_after_s)
    error = over.json()["error"]
    assert error["code"] == "too_many_requests"
    assert error["quota"] == {"name": "runs_in_flight", "limit": 2, "used": 2}
    assert "cancel one" in error["message"]
    runs = (await api.client.get("/v1/runs", headers=auth)).json()["items"]
    assert len(runs) == 2  # nothing stored for the refused one
    # The same key is the same run, even at the limit.
    replay = await api.client.post(
        "/v1/runs", json={"spec": spec()}, headers={**auth, "Idempotency-Key": "k1"}
    )
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    # Another tenant is not affected; and a finished run frees a slot.
    await api.submit(await api.tenant())
    await api.client.post(f"/v1/runs/{first.json()['id']}/cancel", headers=auth)
    assert (
        await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    ).status_code == 201


async def test_request_rate_over_quota_is_429_with_retry_after(api: Api) -> None:
    auth, other = await api.tenant(), await api.tenant()
    await set_quota(api, auth, requests_per_minute=3)
    statuses = [(await api.client.get("/v1/runs", headers=auth)).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    over = await api.client.get("/v1/runs", headers=auth)
    assert over.status_code == 429
    # One token comes back every 20 s at 3 per minute.
    assert 1 <= int(over.headers["Retry-After"]) <= 20
    assert over.json()["error"]["quota"] == {"name": "requests_per_minute", "limit": 3}
    assert over.json()["error"]["retry_after_s"] == int(over.headers["Retry-After"])
    assert (await api.client.get("/v1/runs", headers=other)).status_code == 200
    # Bad keys are refused before the bucket: they cannot spend a tenant's budget.
    assert (
        await api.client.get("/v1/runs", headers={"Authorization": "Bearer x"})
    ).status_code == 401


def test_the_token_bucket_refills_continuously() -> None:
    bucket = TokenBucket(3, now=0.0)
    assert [bucket.take(3, now=0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(3, now=0.0) == pytest.approx(20.0)
    assert bucket.take(3, now=10.0) == pytest.approx(10.0)
    assert bucket.take(3, now=20.0) == 0.0
    assert bucket.take(3, now=1000.0) == 0.0 and bucket.tokens == pytest.approx(2.0)  # capped
    assert bucket.take(0, now=1000.0) == 60.0  # a zero quota refuses everything


def test_the_callback_rate_is_kept_per_source_address() -> None:
    now = [0.0]
    limiter = Limiter(Settings(callback_requests_per_minute=2), clock=lambda: now[0])
    for address in ("192.0.2.1", "192.0.2.1", "192.0.2.2"):
        limiter.take_callback(address)
    with pytest.raises(TooManyRequests) as over:
        limiter.take_callback("::ffff:192.0.2.1")  # the same host, as an IPv4-mapped address
    assert over.value.headers == {"Retry-After": "30"}
    assert "from 192.0.2.1" in over.value.message
    # One IPv6 host usually holds a whole /64: it is one source.
    limiter.take_callback("2001:db8:1:2::1")
    limiter.take_callback("2001:db8:1:2:ffff::9")
    with pytest.raises(TooManyRequests, match="2001:db8:1:2::/64"):
        limiter.take_callback("2001:db8:1:2::2")
    limiter.take_callback("2001:db8:1:3::1")  # the next /64 is another source
    now[0] = 30.0
    limiter.take_callback("192.0.2.1")  # a token back after 60 / 2 s


def test_the_callback_buckets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quotas, "_SOURCES_MAX", 3)
    limiter = Limiter(Settings(callback_requests_per_minute=1), clock=lambda: 0.0)
    for i in range(5):
        limiter.take_callback(f"192.0.2.{i}")
    with pytest.raises(TooManyRequests):
        limiter.take_callback("192.0.2.4")  # the most recent are kept...
    limiter.take_callback("192.0.2.0")  # ...the longest quiet forgotten: a full bucket again


@pytest.fixture
async def small_bodies(app_database: str) -> AsyncIterator[Api]:
    async with running_api(app_database, quota_body_bytes=2000) as running:
        yield running


async def test_a_body_over_the_limit_is_413_from_content_length(small_bodies: Api) -> None:
    api = small_bodies
    auth = await api.tenant()
    body = {"spec": spec(), "name": "x" * 3000}
    r = await api.client.post("/v1/runs", json=body, headers=auth)
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "payload_too_large" and error["field"] == "body"
    assert error["limit_bytes"] == 2000 and "2000 bytes" in error["message"]
    assert r.headers["X-Request-ID"]  # the middleware order: ids and metrics cover it too
    assert (await api.client.get("/v1/runs", headers=auth)).json()["items"] == []


async def test_a_streamed_body_over_the_limit_is_413_while_reading(small_bodies: Api) -> None:
    api = small_bodies
    auth = await api.tenant()

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"spec": {"environment": {"name": "guess_number"}}, "name": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'

    r = await api.client.post(
        "/v1/runs", content=chunks(), headers={**auth, "Content-Type": "application/json"}
    )
    assert "content-length" not in r.request.headers  # chunked: no length to trust
    assert r.status_code == 413 and r.json()["error"]["limit_bytes"] == 2000
    assert (await api.client.get("/v1/runs", headers=auth)).json()["items"] == []


async def test_body_limits_per_tenant_and_for_the_worker(small_bodies: Api) -> None:
    api = small_bodies
    auth = await api.tenant()
    await set_quota(api, auth, body_bytes=10_000)
    ok = await api.client.post("/v1/runs", json={"spec": spec(), "name": "x" * 150}, headers=auth)
    big = await api.client.post(
        "/v1/runs", json={"spec": spec(), "name": "n", "x": "y" * 5000}, headers=auth
    )
    assert ok.status_code == 201
    assert big.status_code == 422  # past the size check: the unknown field is the problem
    # The worker's batches have their own, larger limit.
    run_id = ok.json()["id"]
    await api.internal(run_id, "claim", worker_id="w")
    points = [{"step": i, "name": "loss", "value": 0.5} for i in range(200)]
    r = await api.client.post(
        f"/internal/runs/{run_id}/metrics",
        json={"worker_id": "w", "seq": 0, "points": points},
        headers=lease(api.leases[run_id]),
    )
    assert len(r.request.content) > 2000 and r.status_code == 200, r.text


async def test_two_api_processes_share_one_request_bucket(app_database: str) -> None:
    async with running_api(app_database) as one, running_api(app_database) as two:
        now = [1_000_000.0]  # one wall clock for both, moved by hand: no race with time
        for api in (one, two):
            shared = api.state.limits.buckets
            assert isinstance(shared, SharedBuckets)  # a server database: the shared bucket
            buckets = SharedBuckets(shared.engine, clock=lambda: now[0])
            api.state.limits = Limiter(api.state.settings, buckets=buckets)
        auth = await one.tenant()
        await set_quota(one, auth, requests_per_minute=4)
        statuses = [
            (await api.client.get("/v1/runs", headers=auth)).status_code
            for api in (one, two, one, two)
        ]
        assert statuses == [200, 200, 200, 200]  # four in all, two through each process
        for api in (one, two):  # each process alone has had only two: both refuse
            over = await api.client.get("/v1/runs", headers=auth)
            assert over.status_code == 429
            assert over.headers["Retry-After"] == "15"  # one request every 60 / 4 s
            assert over.json()["error"]["quota"] == {"name": "requests_per_minute", "limit": 4}
        now[0] += 15.0
        assert (await two.client.get("/v1/runs", headers=auth)).status_code == 200
        assert (await one.client.get("/v1/runs", headers=auth)).status_code == 429
