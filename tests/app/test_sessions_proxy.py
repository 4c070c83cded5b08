"""Sessions through the API: the control plane proxies a session's calls to its run's gateway.

The gateway is the real one (worker/gateway.py over a `SessionBroker` and a scripted
engine, on loopback, `tests.worker.test_gateway.Served`); the run is submitted, claimed
and its gateway registered through the API's own routes, as a worker would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta

import pytest

from app.api.sessions import ACTIONS
from app.db.models import utcnow
from app.services.gateways import CACHE_S, Gateway, GatewayCache
from app.services.leases import reap_expired_leases
from app.services.session_ends import session_key
from sdk.sessions import SessionGateway
from tests.app.conftest import Api, spec
from tests.app.test_limits import set_quota
from tests.worker.test_gateway import ANSWER, ARGUMENTS, TOKEN, TOOLS, Served

pytestmark = pytest.mark.anyio

SESSIONS_SPEC = {"environment": {"name": "sessions"}, "rollout": {"group_size": 2}}
QUESTION = {"model": "policy", "messages": [{"role": "user", "content": "What is 3 + 4?"}]}


@pytest.fixture
def gateway() -> Iterator[Served]:
    served = Served(groups=2, group_size=2, timeout_s=30.0)
    try:
        yield served
    finally:
        served.close()


async def sessions_run(api: Api, auth: dict[str, str], gateway: Served | None) -> str:
    run_id = await api.submit(auth, **SESSIONS_SPEC)
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    if gateway is not None:
        answer = await api.internal(run_id, "gateway", worker_id="w1", url=gateway.url, token=TOKEN)
        assert answer.status_code == 200, answer.text
    return run_id


async def test_a_session_opened_through_the_api_is_served_by_the_runs_gateway(
    api: Api, gateway: Served
) -> None:
    auth = await api.tenant()
    run_id = await sessions_run(api, auth, gateway)
    opened = await api.client.post(
        f"/v1/runs/{run_id}/sessions", json={"group": "task-1"}, headers=auth
    )
    assert opened.status_code == 201, opened.text
    session = opened.json()
    base = f"http://rlaas.test/v1/runs/{run_id}/sessions/{session['session_id']}"
    assert session["base_url"] == base and session["group"] == "task-1"
    key = {"Authorization": f"Bearer {session['api_key']}"}

    answer = await api.client.post(
        f"{base}/chat/completions", json={**QUESTION, "tools": TOOLS}, headers=key
    )
    assert answer.status_code == 200, answer.text
    (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == ARGUMENTS  # the sampled bytes, through two hops

    streamed = await api.client.post(
        f"{base}/chat/completions", json={**QUESTION, "stream": True}, headers=key
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"

    ended = await api.client.post(f"{base}/end", json={"reward": 1.0}, headers=key)
    assert ended.status_code == 200 and ended.json()["calls"] == 2
    (traj,) = gateway.wait_finished(1)
    assert traj.end_state == "done" and traj.reward == 1.0


async def test_a_text_completion_through_the_api_is_recorded_with_the_sessions_calls(
    api: Api, gateway: Served
) -> None:
    auth = await api.tenant()
    run_id = await sessions_run(api, auth, gateway)
    session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
    base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"
    key = {"Authorization": f"Bearer {session['api_key']}"}
    prompt = {"model": "policy", "prompt": "Q: 3 + 4?\nA:", "max_tokens": 64}

    answer = await api.client.post(f"{base}/completions", json=prompt, headers=key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "text_completion"
    assert ARGUMENTS in answer.json()["choices"][0]["text"]  # the sampled text, as sampled
    streamed = await api.client.post(
        f"{base}/completions", json={**prompt, "stream": True}, headers=key
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ANSWER
    refused = await api.client.post(
        f"{base}/completions", json={**prompt, "echo": True}, headers=key
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"

    ended = await api.client.post(f"{base}/end", json={"reward": 1.0}, headers=key)
    assert ended.status_code == 200 and ended.json()["calls"] == 2


async def test_what_the_gateway_refuses_comes_back_as_it_said_it(api: Api, gateway: Served) -> None:
    auth = await api.tenant()
    run_id = await sessions_run(api, auth, gateway)
    session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
    base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"
    refused = await api.client.post(
        f"{base}/chat/completions",
        json={**QUESTION, "logit_bias": {"1": 5}},
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "logit_bias"
    # The tenant's key is not a session's key.
    assert (
        await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=auth)
    ).status_code == 404
    # Two groups of two: the fifth session waits (the run's backpressure).
    for _ in range(3):
        await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)
    full = await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)
    assert full.status_code == 429 and full.headers["retry-after"] == "1"


async def test_a_sessions_calls_spend_its_tenants_requests_and_only_with_its_key(
    api: Api, gateway: Served
) -> None:
    """Sessions are rate-limited with the tenant's own bucket (the one its /v1 calls
    spend), a model call at a tenth of a request (``session_call_cost``): past it, 429
    with Retry-After; a call without the session's key spends nothing; another tenant's
    budget is untouched."""
    assert api.state.settings.session_call_cost == 0.1
    auth, other = await api.tenant(), await api.tenant()
    await set_quota(api, auth, requests_per_minute=3)
    run_id = await sessions_run(api, auth, gateway)  # the submit spends one request
    session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
    base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"  # the open spends one
    for _ in range(20):  # nobody without one of the tenant's keys can spend its budget
        wrong = await api.client.post(
            f"{base}/chat/completions", json=QUESTION, headers={"Authorization": "Bearer x"}
        )
        assert wrong.status_code in (401, 404), wrong.text
    key = {"Authorization": f"Bearer {session['api_key']}"}
    served = 0
    for _ in range(30):
        answer = await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=key)
        if answer.status_code != 200:
            break
        served += 1
    # The request left is ten calls; the minute's refill may add one while they run.
    assert answer.status_code == 429 and 10 <= served <= 11, (served, answer.text)
    assert 1 <= int(answer.headers["Retry-After"]) <= 2
    error = answer.json()["error"]
    assert error["quota"] == {"name": "requests_per_minute", "limit": 3}
    assert "a session's call costs 0.1 of a request: 30 calls a minute" in error["message"]
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 429  # one bucket
    assert (await api.client.get("/v1/runs", headers=other)).status_code == 200


async def test_sessions_need_a_served_sessions_run_of_ones_own(api: Api) -> None:
    auth, other = await api.tenant(), await api.tenant()
    run_id = await sessions_run(api, auth, gateway=None)
    waiting = await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)
    assert waiting.status_code == 503 and waiting.headers["retry-after"] == "2"
    assert "not started serving" in waiting.json()["error"]["message"]
    assert (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=other)).status_code == 404
    assert (await api.client.post(f"/v1/runs/{run_id}/sessions")).status_code == 401
    game = await api.submit(auth, **spec())
    refused = await api.client.post(f"/v1/runs/{game}/sessions", headers=auth)
    assert refused.status_code == 409 and "sessions" in refused.json()["error"]["message"]


async def test_a_sessions_calls_tell_nothing_of_runs_to_callers_without_its_key(
    api: Api,
) -> None:
    """The call routes take no API key: whatever the run (another tenant's, not a sessions
    run, not served yet, unknown), the answer is the same 404."""
    auth = await api.tenant()
    waiting = await sessions_run(api, auth, gateway=None)
    game = await api.submit(auth, **spec())
    for run_id in (waiting, game, "run_unknown"):
        for action in ACTIONS:
            answer = await api.client.post(
                f"/v1/runs/{run_id}/sessions/s1/{action}", json=QUESTION, headers=auth
            )
            assert answer.status_code == 404, (run_id, action, answer.text)
            assert answer.json()["error"]["code"] == "not_found"


async def test_only_the_lease_holder_registers_a_gateway(api: Api) -> None:
    auth = await api.tenant()
    run_id = await sessions_run(api, auth, gateway=None)
    taken = await api.internal(
        run_id, "gateway", worker_id="w2", url="http://10.0.0.9:1", token="x" * 24
    )
    assert taken.status_code == 409


def test_the_gateway_cache_expires_and_forgets_a_gateway_that_did_not_answer() -> None:
    now = [100.0]
    cache = GatewayCache(clock=lambda: now[0])
    cache.put("run_1", Gateway("http://10.0.0.5:9000", "token", "ten_1"))
    assert cache.get("run_1") == Gateway("http://10.0.0.5:9000", "token", "ten_1")
    now[0] += CACHE_S + 0.01
    assert cache.get("run_1") is None  # read from the database again
    cache.put("run_1", Gateway("http://10.0.0.6:9000", "token", "ten_1"))
    cache.drop("run_1")  # it did not answer: the run may have moved
    assert cache.get("run_1") is None


async def test_calls_that_miss_the_gateway_cache_together_share_one_lookup() -> None:
    cache, loads = GatewayCache(), []

    async def load() -> Gateway:
        loads.append(1)
        await asyncio.sleep(0.05)  # the database read
        if len(loads) == 1:
            raise ConnectionError("the database went away")
        return Gateway("http://10.0.0.7:8080", "token", "ten_1")

    first = await asyncio.gather(
        *(cache.lookup("run_1", load) for _ in range(20)), return_exceptions=True
    )
    assert len(loads) == 1 and all(isinstance(r, ConnectionError) for r in first)
    again = await asyncio.gather(*(cache.lookup("run_1", load) for _ in range(20)))
    assert len(loads) == 2 and set(again) == {Gateway("http://10.0.0.7:8080", "token", "ten_1")}
    assert await cache.lookup("run_1", load) == again[0] and len(loads) == 2  # cached


@pytest.mark.parametrize(
    ("status", "error", "told"),
    [
        ("succeeded", None, "has ended (succeeded)"),
        ("failed", "ClientFaults: 64 sessions in a row", "has ended (failed: ClientFaults: 64"),
        ("cancelled", None, "has ended (cancelled)"),
    ],
)
async def test_a_session_open_when_its_run_ends_is_told_how_it_ended(
    api: Api, status: str, error: str | None, told: str
) -> None:
    """The worker's gateway goes with the run: a session's calls then answer 410 naming the
    run's end, to the session's own key only (its key is signed with the run's token)."""
    served = Served(groups=1, group_size=2, timeout_s=30.0)
    try:
        auth = await api.tenant()
        run_id = await sessions_run(api, auth, served)
        session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
        base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"
        key = {"Authorization": f"Bearer {session['api_key']}"}
        answer = await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=key)
        assert answer.status_code == 200
        await api.internal(run_id, "status", worker_id="w1", status="running")
        ended = {"status": status} | ({"error": error} if error else {})
        assert (await api.internal(run_id, "status", worker_id="w1", **ended)).status_code == 200
    finally:
        served.close()  # the run's end closes its gateway
    for wait in (0.0, CACHE_S + 0.1):  # the gateway cached (no answer), then read again
        await asyncio.sleep(wait)
        for action in ACTIONS:
            gone = await api.client.post(f"{base}/{action}", json=QUESTION, headers=key)
            assert gone.status_code == 410, (action, gone.text)
            assert told in gone.json()["error"]["message"]
            assert "Open no more sessions" in gone.json()["error"]["message"]
        # Without the session's key, nothing is told of the run.
        for other in ({"Authorization": "Bearer not-its-key"}, auth, {}):
            answer = await api.client.post(f"{base}/end", json={"reward": 1}, headers=other)
            assert answer.status_code == 404, answer.text
    # Opening a session of an ended run names its state too.
    refused = await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)
    assert refused.status_code == 409 and status in refused.json()["error"]["message"]


async def test_a_session_of_an_attempt_that_died_is_told_it_was_lost(api: Api) -> None:
    """A worker holding a sessions run dies; the run goes on in a new attempt with a new
    gateway. The old session's calls answer 410 ``session_lost`` (play the episode
    again) to its key, counted for the operator; other keys still learn nothing."""
    auth = await api.tenant()
    first = Served(groups=1, group_size=2, timeout_s=30.0)
    try:
        run_id = await sessions_run(api, auth, first)
        session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
        base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"
        key = {"Authorization": f"Bearer {session['api_key']}"}
        answer = await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=key)
        assert answer.status_code == 200
    finally:
        first.close()  # the worker dies with its gateway
    # While nobody holds the run again, the worker may only be slow: the 404 says so.
    waiting = await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=key)
    assert waiting.status_code == 404 and "did not answer" in waiting.json()["error"]["message"]
    later = utcnow() + timedelta(hours=1)
    assert await api.db(lambda s: reap_expired_leases(s, later)) == [run_id]
    assert (await api.internal(run_id, "claim", worker_id="w2")).status_code == 200
    lost_calls = "rlaas_sessions_lost_calls_total"
    registry = api.app.state.observability.registry
    before = registry.get_sample_value(lost_calls)
    for action in ACTIONS:  # the new attempt has not served yet
        gone = await api.client.post(f"{base}/{action}", json=QUESTION, headers=key)
        assert gone.status_code == 410, (action, gone.text)
        assert gone.json()["error"]["code"] == "session_lost"
        assert "play the episode again" in gone.json()["error"]["message"]
    second = Served(groups=1, group_size=2, timeout_s=30.0, token="the-second-attempts-token")
    try:
        registered = await api.internal(
            run_id, "gateway", worker_id="w2", url=second.url, token=second.token
        )
        assert registered.status_code == 200
        await asyncio.sleep(CACHE_S + 0.1)  # the first gateway's cache entry has expired
        gone = await api.client.post(f"{base}/chat/completions", json=QUESTION, headers=key)
        assert gone.status_code == 410 and gone.json()["error"]["code"] == "session_lost"
        for other in ({"Authorization": "Bearer not-its-key"}, auth):
            answer = await api.client.post(f"{base}/end", json={"reward": 1}, headers=other)
            assert answer.status_code == 404, answer.text
        # The new attempt serves new sessions.
        again = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
        new_key = {"Authorization": f"Bearer {again['api_key']}"}
        answer = await api.client.post(
            f"/v1/runs/{run_id}/sessions/{again['session_id']}/chat/completions",
            json=QUESTION,
            headers=new_key,
        )
        assert answer.status_code == 200, answer.text
    finally:
        second.close()
    assert registry.get_sample_value(lost_calls) == (before or 0.0) + len(ACTIONS) + 1


def test_the_control_plane_derives_a_sessions_key_as_the_gateway_does() -> None:
    served = Served(groups=1, group_size=1, timeout_s=30.0)
    try:
        session = SessionGateway(served.url, TOKEN).open()
        assert session_key(TOKEN, session.session_id) == session.api_key
        assert session_key("another-runs-token", session.session_id) != session.api_key
    finally:
        served.close()
