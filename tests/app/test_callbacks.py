"""Deferred step results on real Postgres: signed posts, replays, and the worker's long-poll."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import EnvCallback
from app.settings import Settings
from rl_core.protocol.signing import HEADER, sign
from tests.app.conftest import WORKER, Api, lease, running_api

pytestmark = pytest.mark.anyio
SECRET = "callback-secret-0123456789abcdef"
RESULT = {"messages": [{"role": "user", "content": "too low"}], "reward": 0.0, "done": False}


@dataclass
class Episode:
    run_id: str
    episode_id: str
    auth: dict[str, str]


async def running_episode(api: Api) -> Episode:
    auth = await api.tenant()
    r = await api.client.post(
        "/v1/environments",
        json={"name": "deferred", "url": "http://127.0.0.1:9/env", "secret": SECRET},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    run_id = await api.submit(auth, environment={"name": r.json()["id"]})
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    return Episode(run_id, f"{run_id}~s0-g0-e1", auth)


@pytest.fixture
async def local(app_database: str) -> Any:
    async with running_api(app_database, env_url_allowlist="loopback") as api:
        yield api


def bound(episode_id: str, step: int, result: dict[str, Any] = RESULT) -> dict[str, Any]:
    """A callback body: the result, naming the step it answers."""
    return {"episode_id": episode_id, "step": step, **result}


async def post(api: Api, episode_id: str, step: int, body: Any = None, **sign_kw: Any) -> Any:
    body = bound(episode_id, step) if body is None else body
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    secret = sign_kw.pop("secret", SECRET)
    headers = {"Content-Type": "application/json"}
    header = sign_kw.pop("header") if "header" in sign_kw else sign(secret, raw, **sign_kw)
    if header is not None:
        headers[HEADER] = header
    return await api.client.post(
        f"/v1/env-callbacks/{episode_id}/{step}", content=raw, headers=headers
    )


async def poll(api: Api, run_id: str, episode_id: str, step: int, wait_s: float) -> Any:
    """The worker's long-poll, with the lease token of ``run_id``'s claim (or, for a run it
    never claimed, of the episode's run: a token of another run)."""
    token = api.leases.get(run_id) or api.leases[episode_id.partition("~")[0]]
    return await api.client.get(
        f"/internal/runs/{run_id}/env-callbacks/{episode_id}/{step}",
        params={"wait_s": wait_s},
        headers=lease(token),
    )


async def test_a_signed_result_is_stored_once_and_relayed(local: Api) -> None:
    ep = await running_episode(local)
    for step in (3, 4):  # the worker awaits both (for callback_await_grace_s past its poll)
        assert (await poll(local, ep.run_id, ep.episode_id, step, wait_s=0)).status_code == 204
    r = await post(local, ep.episode_id, 3)
    assert r.status_code == 202 and r.json() == {"accepted": True}
    replay = await post(local, ep.episode_id, 3)
    assert replay.status_code == 409 and replay.json()["error"]["field"] == "step"
    assert (await post(local, ep.episode_id, 4)).status_code == 202  # the next step is new

    got = await poll(local, ep.run_id, ep.episode_id, 3, wait_s=0)
    assert got.status_code == 200 and got.json() == {"body": bound(ep.episode_id, 3)}
    rows = await local.db(lambda s: s.scalars(select(EnvCallback).order_by(EnvCallback.step)))
    delivered = [(row.step, row.delivered_at is not None) for row in rows]
    assert delivered == [(3, True), (4, False)]
    # Fetched again (the worker lost the answer): the same body, at least once.
    again = await poll(local, ep.run_id, ep.episode_id, 3, wait_s=0)
    assert again.json() == {"body": bound(ep.episode_id, 3)}


async def test_a_post_that_beats_the_workers_first_poll_is_held_for_it(local: Api) -> None:
    # The environment posts as soon as it has answered 202; the worker polls after it
    # has read the 202. The post waits for the poll (callback_await_grace_s, 10 s here).
    ep = await running_episode(local)
    posting = asyncio.create_task(post(local, ep.episode_id, 2))
    await asyncio.sleep(0.2)
    assert not posting.done()
    got = await poll(local, ep.run_id, ep.episode_id, 2, wait_s=10)
    assert got.status_code == 200 and got.json() == {"body": bound(ep.episode_id, 2)}
    assert (await asyncio.wait_for(posting, timeout=10)).status_code == 202


async def test_a_failed_step_is_relayed_as_its_error(local: Api) -> None:
    ep = await running_episode(local)
    failure = bound(ep.episode_id, 1, {"error": {"code": "environment_error", "message": "boom"}})
    waiting = asyncio.create_task(poll(local, ep.run_id, ep.episode_id, 1, wait_s=10))
    assert (await post(local, ep.episode_id, 1, failure)).status_code == 202
    assert (await asyncio.wait_for(waiting, timeout=10)).json() == {"body": failure}


async def test_a_result_after_the_workers_wait_ended_is_gone(app_database: str) -> None:
    async with running_api(
        app_database, env_url_allowlist="loopback", callback_await_grace_s=0
    ) as api:
        ep = await running_episode(api)
        assert (await poll(api, ep.run_id, ep.episode_id, 1, wait_s=0)).status_code == 204
        r = await post(api, ep.episode_id, 1)  # its wait ended with that poll
        assert r.status_code == 410, r.text
        assert "wait ended" in r.json()["error"]["message"]
        never = await post(api, ep.episode_id, 2)
        assert never.status_code == 410 and "not deferred" in never.json()["error"]["message"]


async def test_an_old_style_callback_is_told_what_to_add(local: Api) -> None:
    ep = await running_episode(local)
    r = await post(local, ep.episode_id, 3, RESULT)  # the result alone, as before
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "episode_id"
    assert f'add "episode_id": "{ep.episode_id}" and "step": 3' in error["message"]
    typed = await post(local, ep.episode_id, 3, {**bound(ep.episode_id, 3), "step": "3"})
    assert typed.status_code == 422 and typed.json()["error"]["field"] == "step"


async def test_nothing_yet_is_204_after_wait_s(local: Api) -> None:
    ep = await running_episode(local)
    r = await poll(local, ep.run_id, ep.episode_id, 1, wait_s=0.2)
    assert r.status_code == 204 and r.content == b""


async def test_a_waiting_poll_is_woken_in_process(app_database: str) -> None:
    # DB polling every 60 s: only the in-process wake-up can answer within the 10 s below.
    async with running_api(app_database, env_url_allowlist="loopback", callback_poll_s=60) as api:
        ep = await running_episode(api)
        waiting = asyncio.create_task(poll(api, ep.run_id, ep.episode_id, 2, wait_s=50))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        assert (await post(api, ep.episode_id, 2)).status_code == 202
        got = await asyncio.wait_for(waiting, timeout=10)
        assert got.status_code == 200 and got.json() == {"body": bound(ep.episode_id, 2)}


async def test_a_result_posted_to_another_api_process_reaches_the_poll(app_database: str) -> None:
    async with (
        running_api(app_database, env_url_allowlist="loopback") as taker,
        running_api(app_database, env_url_allowlist="loopback", callback_poll_s=0.1) as waiter,
    ):
        ep = await running_episode(taker)
        waiter.leases.update(taker.leases)  # the worker claimed through one, polls the other
        waiting = asyncio.create_task(poll(waiter, ep.run_id, ep.episode_id, 5, wait_s=20))
        await asyncio.sleep(0.2)
        assert (await post(taker, ep.episode_id, 5)).status_code == 202
        got = await asyncio.wait_for(waiting, timeout=10)
        assert got.status_code == 200 and got.json() == {"body": bound(ep.episode_id, 5)}


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ({"header": None}, f"missing {HEADER} header"),
        ({"secret": "not-the-registered-secret"}, "does not match"),
        ({"timestamp": int(time.time()) - 3600}, "window is 300s"),
        ({"header": "v1=abc"}, "must carry t="),
        ({"header": "garbage"}, "is not key=value"),
    ],
)
async def test_bad_signatures_are_401_naming_the_header(
    local: Api, how: dict[str, Any], words: str
) -> None:
    ep = await running_episode(local)
    r = await post(local, ep.episode_id, 1, **how)
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["field"] == HEADER and words in error["message"]
    rows = await local.db(lambda s: s.scalars(select(EnvCallback)))
    assert list(rows) == []


async def test_a_tampered_body_does_not_verify(local: Api) -> None:
    ep = await running_episode(local)
    header = sign(SECRET, json.dumps(bound(ep.episode_id, 1)).encode())
    tampered = bound(ep.episode_id, 1, {**RESULT, "reward": 1.0})
    r = await post(local, ep.episode_id, 1, tampered, header=header)
    assert r.status_code == 401 and "does not match" in r.json()["error"]["message"]


async def test_unknown_runs_and_episodes_are_404(local: Api) -> None:
    ep = await running_episode(local)
    for episode_id in ("no-tilde-here", "run_doesnotexist~e1", "~e1"):
        r = await post(local, episode_id, 1)
        assert r.status_code == 404, episode_id
        assert r.json()["error"]["field"] == "episode_id"
    builtin_run = await local.submit(ep.auth)  # guess_number: no registered environment
    await local.internal(builtin_run, "claim", worker_id="w2")
    r = await post(local, f"{builtin_run}~e1", 1)
    assert r.status_code == 404 and "registered environment" in r.json()["error"]["message"]


async def test_a_finished_run_takes_no_results(local: Api) -> None:
    ep = await running_episode(local)
    await local.internal(ep.run_id, "status", worker_id="w1", status="running")
    await local.internal(ep.run_id, "status", worker_id="w1", status="failed", error="x")
    r = await post(local, ep.episode_id, 1)
    assert r.status_code == 410 and "failed" in r.json()["error"]["message"]


async def test_a_signed_body_that_is_not_a_json_object_is_422(local: Api) -> None:
    ep = await running_episode(local)
    for raw in (b"not json", b"[1, 2]"):
        r = await post(local, ep.episode_id, 1, raw)
        assert r.status_code == 422 and r.json()["error"]["field"] == "body"


async def test_the_long_poll_needs_the_runs_lease_token_and_a_matching_run(local: Api) -> None:
    ep = await running_episode(local)
    url = f"/internal/runs/{ep.run_id}/env-callbacks/{ep.episode_id}/1"
    assert (await local.client.get(url)).status_code == 401
    for headers in (ep.auth, WORKER):  # a tenant's key; the shared worker token
        r = await local.client.get(url, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["field"] == "Authorization"
    other = await poll(local, "run_other", ep.episode_id, 1, wait_s=0)
    assert other.status_code == 404 and other.json()["error"]["field"] == "episode_id"
    missing = await local.client.get(
        "/internal/runs/run_nope/env-callbacks/run_nope~e1/1",
        headers=lease(local.leases[ep.run_id]),
    )
    assert missing.status_code == 403 and "does not hold run run_nope" in missing.text
    too_long = await poll(local, ep.run_id, ep.episode_id, 1, wait_s=61)
    assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "wait_s"


def test_the_protocol_page_states_the_control_planes_defaults() -> None:
    page = (Path(__file__).parents[2] / "docs" / "environment-protocol.md").read_text()
    defaults = Settings.model_fields
    assert f"held for up to {defaults['callback_await_grace_s'].default:g} seconds" in page
    assert f"({defaults['callback_requests_per_minute'].default} a minute" in page
