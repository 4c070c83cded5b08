"""Stored callback rows do not pile up: the reaper's pass sweeps the rows of runs that no
longer run, and the rows nobody has awaited for ``callback_retention_s``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.db.models import EnvCallback, utcnow
from app.main import reap_once
from tests.app.conftest import Api, running_api
from tests.security.callbacks import WebhookRun, post, signed_result, webhook_run, worker_waits

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    async with running_api(
        app_database, env_url_allowlist="loopback", callback_retention_s=600
    ) as running:
        yield running


async def rows(api: Api) -> set[tuple[str, int]]:
    found = await api.db(lambda s: s.scalars(select(EnvCallback)))
    return {(row.episode_id, row.step) for row in found}


async def answered(api: Api, run_id: str, episode_id: str, step: int) -> None:
    """A deferred step answered and fetched, as in a run that works."""
    run = WebhookRun(api, {}, "", run_id)
    async with worker_waits(run, episode_id, step) as waiting:
        raw, header = signed_result(episode_id, step)
        r = await post(api.client, episode_id, step, raw, header)
        assert r.status_code == 202, r.text
        assert (await waiting).status_code == 200


async def test_rows_of_runs_that_no_longer_run_are_swept(api: Api) -> None:
    ended, going = await webhook_run(api), await webhook_run(api)
    await answered(api, ended.run_id, ended.episode(), 1)
    await answered(api, going.run_id, going.episode(), 1)
    worker = f"w-{ended.run_id}"
    await api.internal(ended.run_id, "status", worker_id=worker, status="running")
    await api.internal(ended.run_id, "status", worker_id=worker, status="failed", error="x")

    await reap_once(api.state)
    assert await rows(api) == {(going.episode(), 1)}


async def test_rows_nobody_awaited_for_the_retention_are_swept(api: Api) -> None:
    run = await webhook_run(api)
    old, new = run.episode("g0-e0"), run.episode("g0-e1")
    await answered(api, run.run_id, old, 1)
    await answered(api, run.run_id, new, 1)
    long_ago = utcnow() - timedelta(seconds=601)
    await api.db(
        lambda s: s.execute(
            update(EnvCallback).where(EnvCallback.episode_id == old).values(awaited_until=long_ago)
        )
    )

    await reap_once(api.state)
    assert await rows(api) == {(new, 1)}
