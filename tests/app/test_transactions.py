"""The request edge owns the transaction: idempotent submits, dispatch only after commit."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from sqlalchemy import func, select

from app.api.deps import AfterCommitDep, SessionDep, TenantDep
from app.db.models import Run, RunEvent
from app.errors import Conflict
from app.schemas import RunCreate
from app.services import runs as service
from app.services.tenants import create_tenant
from tests.app.conftest import Api, plain, running_api, spec

pytestmark = pytest.mark.anyio


async def count(api: Api, model: type[Any]) -> int:
    return int(await api.db(lambda s: s.scalar(select(func.count()).select_from(model))) or 0)


async def test_same_key_same_body_is_the_same_run_and_another_body_is_409(api: Api) -> None:
    auth = {**(await api.tenant()), "Idempotency-Key": "abc-1"}
    first = await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    again = await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = await api.client.post("/v1/runs", json={"spec": spec(train={"steps": 9})}, headers=auth)
    assert other.status_code == 409 and other.json()["error"]["field"] == "Idempotency-Key"
    assert await count(api, Run) == 1 and api.dispatcher.sent == [first.json()["id"]]


async def test_the_same_body_written_differently_is_the_same_request(api: Api) -> None:
    auth = {**(await api.tenant()), "Idempotency-Key": "k"}
    # Defaults spelled out, keys in another order: the validated spec is what is compared.
    a = {"spec": spec()}
    b = {"spec": {"train": {"steps": 3}, "environment": {"name": "guess_number", "config": {}}}}
    first = await api.client.post("/v1/runs", json=a, headers=auth)
    again = await api.client.post("/v1/runs", json=b, headers=auth)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


async def test_keys_are_per_tenant(api: Api) -> None:
    key = {"Idempotency-Key": "shared"}
    a, b = await api.tenant(), await api.tenant()
    run_a = await api.client.post("/v1/runs", json={"spec": spec()}, headers={**a, **key})
    run_b = await api.client.post("/v1/runs", json={"spec": spec()}, headers={**b, **key})
    assert run_a.status_code == run_b.status_code == 201
    assert run_a.json()["id"] != run_b.json()["id"]


async def test_racing_requests_with_one_key_make_one_run(api: Api) -> None:
    """The loser of the race hits the unique key, rolls back its savepoint, returns the winner."""
    tenant, _ = await api.db(lambda s: create_tenant(s, "racer"))
    tenant_id = tenant.id
    body = RunCreate.model_validate({"spec": spec()})
    sessions = api.state.sessions
    async with sessions() as first, sessions() as second:
        run, created = await service.create_run(
            first, tenant_id, body, "race", routes=api.state.routes
        )
        assert created
        # The second request looked before the first committed, so it inserts and blocks.
        loser = asyncio.create_task(
            service.create_run(second, tenant_id, body, "race", routes=api.state.routes)
        )
        await asyncio.sleep(0.3)
        assert not loser.done()
        await first.commit()
        replayed, created_again = await asyncio.wait_for(loser, 10)
        assert replayed.id == run.id and not created_again
        await second.commit()
    assert await count(api, Run) == 1 and await count(api, RunEvent) == 1


async def test_a_request_that_fails_after_writing_leaves_no_rows_and_sends_nothing(
    api: Api,
) -> None:
    @api.app.post("/test/create-then-fail")
    async def create_then_fail(
        body: RunCreate, session: SessionDep, tenant_id: TenantDep, after: AfterCommitDep
    ) -> None:
        run, _ = await service.create_run(session, tenant_id, body, None, routes=api.state.routes)
        after.runs.append((run.id, run.accelerator))
        raise Conflict("failing on purpose after the run was flushed")

    auth = await api.tenant()
    r = await api.client.post("/test/create-then-fail", json={"spec": spec()}, headers=auth)
    assert r.status_code == 409 and r.json()["error"]["message"].startswith("failing on purpose")
    assert await count(api, Run) == 0 and await count(api, RunEvent) == 0
    assert api.dispatcher.sent == []


class VisibilityDispatcher:
    """Records, at send time, whether another connection can already see the run."""

    def __init__(self, database_url: str) -> None:
        self.url = plain(database_url)
        self.seen: list[tuple[str, bool]] = []

    def dispatch(self, run_id: str, queue: str) -> None:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT 1 FROM runs WHERE id = %s", (run_id,)).fetchone()
        self.seen.append((run_id, row is not None))

    def close(self) -> None:
        pass


async def test_dispatch_happens_after_commit(app_database: str) -> None:
    dispatcher = VisibilityDispatcher(app_database)
    async with running_api(app_database, dispatcher=dispatcher) as api:
        auth = await api.tenant()
        run_id = await api.submit(auth)
    assert dispatcher.seen == [(run_id, True)]


class BrokenDispatcher:
    def dispatch(self, run_id: str, queue: str) -> None:
        raise ConnectionError("broker down")

    def close(self) -> None:
        pass


async def test_a_broker_failure_after_commit_still_answers_201(app_database: str) -> None:
    async with running_api(app_database, dispatcher=BrokenDispatcher()) as api:
        auth = await api.tenant()
        run_id = await api.submit(auth)  # asserts 201
        got = await api.client.get(f"/v1/runs/{run_id}", headers=auth)
        assert got.json()["status"] == "queued"
