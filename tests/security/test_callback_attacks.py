"""Attacks on the unauthenticated deferred-result route, POST /v1/env-callbacks/{episode_id}/{step}.

Each test is one attack, played with what an attacker can hold: a result the
environment signed and posted (captured in flight; its signature is good for five
minutes), and the route itself, which takes no API key. Each asserts the refusal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select

from app.db.models import EnvCallback
from tests.app.conftest import Api, running_api
from tests.security.callbacks import (
    WINNING,
    poll,
    post,
    signed_result,
    webhook_run,
    worker_waits,
)

pytestmark = pytest.mark.anyio
LOSING = {"messages": [{"role": "user", "content": "too low"}], "reward": 0.0, "done": False}


@pytest.fixture
async def api(app_database: str) -> AsyncIterator[Api]:
    # A short hold for results nobody awaits yet, so that a refusal comes quickly.
    async with running_api(
        app_database, env_url_allowlist="loopback", callback_await_grace_s=0.3
    ) as running:
        yield running


async def stored(api: Api) -> list[tuple[str, int]]:
    """The (episode_id, step) of every result the control plane holds."""
    rows = await api.db(lambda s: s.scalars(select(EnvCallback).order_by(EnvCallback.step)))
    return [(row.episode_id, row.step) for row in rows if row.body is not None]


async def test_a_result_replayed_onto_another_step_is_refused(api: Api) -> None:
    run = await webhook_run(api)
    episode = run.episode()
    async with worker_waits(run, episode, 3) as step3, worker_waits(run, episode, 4) as step4:
        raw, header = signed_result(episode, 3, WINNING)
        assert (await post(api.client, episode, 3, raw, header)).status_code == 202
        assert (await step3).json()["body"]["reward"] == 1.0
        # The captured post, sent again to the step the worker waits on now.
        replay = await post(api.client, episode, 4, raw, header)
        assert replay.status_code == 403, replay.text
        error = replay.json()["error"]
        assert error["field"] == "step"
        assert "signed for step 3, not step 4" in error["message"]
        assert not step4.done()
    assert (await poll(api, run.run_id, episode, 4, wait_s=0)).status_code == 204
    assert await stored(api) == [(episode, 3)]


@pytest.mark.parametrize("where", ["same run", "another run of the environment"])
async def test_a_result_replayed_onto_another_episode_is_refused(api: Api, where: str) -> None:
    run = await webhook_run(api)
    victim = (
        run if where == "same run" else await webhook_run(api, auth=run.auth, env_id=run.env_id)
    )
    episode, other = run.episode("g0-e0"), victim.episode("g0-e1")
    async with worker_waits(run, episode, 2) as mine, worker_waits(victim, other, 2) as theirs:
        raw, header = signed_result(episode, 2, WINNING)
        assert (await post(api.client, episode, 2, raw, header)).status_code == 202
        assert (await mine).status_code == 200
        replay = await post(api.client, other, 2, raw, header)
        assert replay.status_code == 403, replay.text
        error = replay.json()["error"]
        assert (
            error["field"] == "episode_id" and f"signed for episode {episode}" in error["message"]
        )
        assert not theirs.done()
    assert await stored(api) == [(episode, 2)]


async def test_a_result_for_a_step_nobody_awaits_is_gone(api: Api) -> None:
    run = await webhook_run(api)
    episode = run.episode()
    # Signed by the environment itself: late, out of order, or a step never deferred.
    raw, header = signed_result(episode, 7, LOSING)
    r = await post(api.client, episode, 7, raw, header)
    assert r.status_code == 410, r.text
    error = r.json()["error"]
    assert error["code"] == "gone" and error["field"] == "step"
    assert f"no worker waits for episode {episode} step 7" in error["message"]
    assert await stored(api) == []


async def test_a_flood_from_one_address_is_429_with_retry_after(app_database: str) -> None:
    async with running_api(
        app_database, env_url_allowlist="loopback", callback_requests_per_minute=5
    ) as api:
        run = await webhook_run(api)
        episode = run.episode()
        garbage = b'{"reward": 1.0, "done": true}'  # unsigned: costs the attacker nothing
        answers = [
            (await post(api.client, episode, 1, garbage, None)).status_code for _ in range(6)
        ]
        assert answers == [401] * 5 + [429]
        flooded = await post(api.client, episode, 1, garbage, None)
        assert flooded.status_code == 429
        assert int(flooded.headers["Retry-After"]) >= 1
        error = flooded.json()["error"]
        assert error["code"] == "too_many_requests"
        assert error["quota"]["name"] == "callback_requests_per_minute"
        # The limit is the flooding address's: another address is still heard.
        elsewhere = httpx.ASGITransport(app=api.app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=elsewhere, base_url="http://rlaas.test") as other:
            assert (await post(other, episode, 1, garbage, None)).status_code == 401
