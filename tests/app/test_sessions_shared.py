"""Sessions through the API's shared URL and the Responses route.

``/v1/runs/{id}/openai/...``: one base URL and the tenant's key for all of a run's
sessions, each call naming its session (``X-Session-ID``), opened on its first call;
``/v1/runs/{id}/sessions/{sid}/responses``: the Responses API of one session. The
gateway is the real one (`tests.worker.test_gateway.Served`), the run's registered as
a worker would (`tests.app.test_sessions_proxy.sessions_run`).
"""

from __future__ import annotations

import json

import pytest

from tests.app.conftest import Api
from tests.app.test_sessions_proxy import gateway, sessions_run
from tests.worker.test_gateway import ANSWER, ARGUMENTS, TOOLS, Served

pytestmark = pytest.mark.anyio
__all__ = ["gateway"]  # the fixture

QUESTION = {"model": "policy", "messages": [{"role": "user", "content": "What is 3 + 4?"}]}
FLAT_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]


async def test_a_shared_url_serves_sessions_named_per_call_for_the_runs_tenant(
    api: Api, gateway: Served
) -> None:
    auth, other = await api.tenant(), await api.tenant()
    run_id = await sessions_run(api, auth, gateway)
    shared = f"/v1/runs/{run_id}/openai"
    named = {**auth, "X-Session-ID": "rollout-1", "X-Session-Group": "task-1"}

    first = await api.client.post(
        f"{shared}/chat/completions", json={**QUESTION, "tools": TOOLS}, headers=named
    )
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"]["arguments"] == ARGUMENTS
    messages = [
        *QUESTION["messages"],
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": "7"},
    ]
    streamed = await api.client.post(
        f"{shared}/chat/completions",
        json={**QUESTION, "messages": messages, "tools": TOOLS, "stream": True},
        headers=named,
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    data = [
        line.removeprefix("data: ") for line in streamed.text.splitlines() if line[:5] == "data:"
    ]
    text = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in map(json.loads, data[:-1])
        if c["choices"]
    )
    assert text == ANSWER

    # Another tenant's key opens nothing of this run, and names nothing in it.
    stranger = {**other, "X-Session-ID": "rollout-1"}
    refused = await api.client.post(f"{shared}/chat/completions", json=QUESTION, headers=stranger)
    assert refused.status_code == 404
    assert (
        await api.client.post(f"{shared}/sessions/rollout-1/end", json={"reward": 1}, headers=other)
    ).status_code == 404

    ended = await api.client.post(
        f"{shared}/sessions/rollout-1/end", json={"reward": 1.0}, headers=auth
    )
    assert ended.status_code == 200, ended.text
    assert ended.json()["calls"] == 2 and ended.json()["prefix_breaks"] == 0
    (traj,) = gateway.wait_finished(1)
    assert traj.end_state == "done" and traj.reward == 1.0 and traj.turns == 2


async def test_the_responses_api_of_a_session_through_the_api(api: Api, gateway: Served) -> None:
    auth = await api.tenant()
    run_id = await sessions_run(api, auth, gateway)
    session = (await api.client.post(f"/v1/runs/{run_id}/sessions", headers=auth)).json()
    base = f"/v1/runs/{run_id}/sessions/{session['session_id']}"
    key = {"Authorization": f"Bearer {session['api_key']}"}
    body = {"model": "policy", "input": "What is 3 + 4?", "tools": FLAT_TOOLS}

    first = await api.client.post(f"{base}/responses", json=body, headers=key)
    assert first.status_code == 200, first.text
    (call,) = first.json()["output"]
    assert call["type"] == "function_call" and call["arguments"] == ARGUMENTS
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "7"}
    streamed = await api.client.post(
        f"{base}/responses",
        json={
            **body,
            "input": [output],
            "previous_response_id": first.json()["id"],
            "stream": True,
        },
        headers=key,
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: ")
    ]
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ANSWER
    ended = await api.client.post(f"{base}/end", json={"reward": 1.0}, headers=key)
    assert ended.json()["prefix_breaks"] == 0
