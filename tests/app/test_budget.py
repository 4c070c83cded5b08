"""The compute budget on real Postgres: run-seconds per rolling period (from the runs'
events), the per-run cap on train.steps, and what a tenant is told past either."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import RunEvent, Tenant, utcnow
from app.services.budget import run_seconds_used
from app.services.leases import reap_expired_leases
from tests.app.conftest import Api, spec

pytestmark = pytest.mark.anyio

DAY = 86_400


async def set_quotas(api: Api, **quota: int | None) -> None:
    values = {f"quota_{name}": value for name, value in quota.items()}
    await api.db(lambda s: s.execute(update(Tenant).values(**values)))


async def place_events(api: Api, run_id: str, times: list[datetime]) -> None:
    """Give the run's events, oldest first, these times (the clock of a run long gone)."""

    async def apply(session: AsyncSession) -> None:
        ids = (
            await session.scalars(
                select(RunEvent.id).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
            )
        ).all()
        assert len(ids) == len(times), ids
        for event_id, at in zip(ids, times, strict=True):
            await session.execute(
                update(RunEvent).where(RunEvent.id == event_id).values(created_at=at)
            )

    await api.db(apply)


async def run_to_the_end(api: Api, run_id: str) -> None:
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    for status in ("running", "succeeded"):
        r = await api.internal(run_id, "status", worker_id="w1", status=status)
        assert r.status_code == 200, r.text


async def test_a_run_over_the_steps_cap_is_422_naming_the_field(api: Api) -> None:
    auth = await api.tenant()
    await api.submit(auth, train={"steps": 100_000})  # no cap by default
    await set_quotas(api, train_steps=100)
    over = await api.client.post(
        "/v1/runs", json={"spec": spec(train={"steps": 101})}, headers=auth
    )
    assert over.status_code == 422
    error = over.json()["error"]
    assert error["field"] == "spec.train.steps"
    assert error["quota"] == {"name": "train_steps", "limit": 100}
    assert "ask for at most 100 steps" in error["message"]
    at_cap = await api.client.post(
        "/v1/runs", json={"spec": spec(train={"steps": 100})}, headers=auth
    )
    assert at_cap.status_code == 201


async def test_a_spent_budget_is_429_with_retry_after_and_the_quota(api: Api) -> None:
    auth, other = await api.tenant(), await api.tenant()
    await set_quotas(api, run_seconds=600)
    run_id = await api.submit(auth)
    await run_to_the_end(api, run_id)
    now = utcnow()
    # Submitted, then held a worker from two hours ago to one hour ago: 3,600 run-seconds.
    hours_ago = [now - timedelta(hours=h) for h in (3, 2, 2, 1)]
    await place_events(api, run_id, hours_ago)
    over = await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert over.status_code == 429
    error = over.json()["error"]
    assert error["quota"] == {"name": "run_seconds", "limit": 600, "used": 3600, "period_s": DAY}
    # Under 600 s again once the window starts past one hour and ten minutes ago.
    assert DAY - 4200 - 2 <= int(over.headers["Retry-After"]) <= DAY - 4200 + 1
    assert error["retry_after_s"] == int(over.headers["Retry-After"])
    assert "or ask for a higher quota" in error["message"]
    limits = (await api.client.get("/v1/limits", headers=auth)).json()
    assert limits["quotas"]["run_seconds"] == 600 and limits["usage"]["run_seconds"] == 3600
    # Another tenant's runs are its own; nothing was stored for the refused one.
    await api.submit(other)
    assert len((await api.client.get("/v1/runs", headers=auth)).json()["items"]) == 1


async def test_run_seconds_count_holding_a_worker_not_waiting_for_one(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    claim = await api.internal(run_id, "claim", worker_id="w1", lease_seconds=60)
    assert claim.status_code == 200
    now = utcnow()
    assert await api.db(lambda s: reap_expired_leases(s, now + timedelta(seconds=61))) == [run_id]
    assert (await api.internal(run_id, "claim", worker_id="w2")).status_code == 200
    r = await api.internal(run_id, "status", worker_id="w2", status="running")
    assert r.status_code == 200
    t = now - timedelta(seconds=10_000)
    # queued, starting (held 100 s), queued again (waits 2,900 s), starting, running (going).
    times = [t, t + timedelta(seconds=1000), t + timedelta(seconds=1100)]
    times += [t + timedelta(seconds=4000), t + timedelta(seconds=4010)]
    await place_events(api, run_id, times)
    tenant_id = await api.db(lambda s: s.scalar(select(Tenant.id)))
    used, _ = await api.db(lambda s: run_seconds_used(s, tenant_id, DAY, now))
    assert used == pytest.approx(100 + 6000)
    # A shorter period counts only what falls in it.
    used, _ = await api.db(lambda s: run_seconds_used(s, tenant_id, 1000, now))
    assert used == pytest.approx(1000)


async def test_without_a_budget_nothing_is_counted_against_a_submit(api: Api) -> None:
    assert api.state.settings.quota_run_seconds is None  # the default: no budget
    assert api.state.settings.quota_train_steps is None
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await run_to_the_end(api, run_id)
    now = utcnow()
    await place_events(api, run_id, [now - timedelta(hours=h) for h in (20, 19, 19, 1)])
    assert (
        await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    ).status_code == 201
