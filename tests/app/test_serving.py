"""POST /v1/runs/{id}/chat/completions and /internal/serving: the control plane's side of a
served checkpoint (app.services.serving), against real Postgres, with a real HTTP server
on loopback standing in for the worker's (worker/serving.py is proven in
tests/e2e/test_serving.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select

from app.db.models import Artifact, CheckpointServer
from tests.app.conftest import Api

pytestmark = pytest.mark.anyio

ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class FakeServer:
    """A loopback server answering as the worker's does, remembering what it was sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append((request.headers.get("Authorization", ""), body))
        return web.json_response({"object": "chat.completion", "model": "step-2", "choices": []})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def worker_server() -> AsyncIterator[FakeServer]:
    server = FakeServer()
    await server.start()
    try:
        yield server
    finally:
        if server.runner is not None:
            await server.runner.cleanup()


async def checkpoints(api: Api, run_id: str, *steps: int) -> None:
    async def add(session: Any) -> None:
        for step in steps:
            uri = f"/artifacts/{run_id}/checkpoints/step-{step:08d}"
            session.add(Artifact(run_id=run_id, kind="checkpoint", step=step, uri=uri))

    await api.db(add)


async def servers(api: Api) -> list[CheckpointServer]:
    return list(await api.db(lambda s: s.scalars(select(CheckpointServer))))


async def test_a_checkpoint_is_asked_for_then_proxied_to_the_worker_that_registers(
    api: Api, worker_server: FakeServer
) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    url = f"/v1/runs/{run_id}/chat/completions"

    none_yet = await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
    assert none_yet.status_code == 409, none_yet.text
    assert "no checkpoint yet" in none_yet.text and none_yet.json()["error"]["field"] == "model"

    await checkpoints(api, run_id, 1, 2)
    unknown = await api.client.post(url, json={"model": "step-9", **ASK}, headers=auth)
    assert unknown.status_code == 404 and unknown.json()["error"]["field"] == "model"
    assert 'step-1, step-2, or "latest" (step-2)' in unknown.json()["error"]["message"]
    no_model = await api.client.post(url, json=ASK, headers=auth)
    assert no_model.status_code == 400 and no_model.json()["error"]["field"] == "model"
    theirs = await api.client.post(url, json={"model": "latest", **ASK}, headers=await api.tenant())
    assert theirs.status_code == 404, theirs.text

    # The first call asks a worker of the serve queue; calls meanwhile wait (503).
    for _ in range(2):
        loading = await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
        assert loading.status_code == 503 and loading.headers["Retry-After"] == "3"
    [(order, queue)] = api.dispatcher.served
    assert queue == "serve" and order["run_id"] == run_id and order["step"] == 2
    assert order["uri"].endswith("step-00000002") and order["spec"]["train"]["steps"] == 3
    route = f"/internal/serving/{order['server_id']}"

    wrong = await api.client.post(
        route, json={"url": worker_server.url}, headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401
    nobody = await api.client.post(
        "/internal/serving/srv_0", json={"url": worker_server.url}, headers=bearer(order)
    )
    assert nobody.status_code == 404
    still = await api.client.get(route, headers=bearer(order))
    assert still.status_code == 204  # the worker asks before loading
    ok = await api.client.post(route, json={"url": worker_server.url}, headers=bearer(order))
    assert ok.status_code == 204, ok.text

    answered = await api.client.post(url, json={"model": "2", **ASK}, headers=auth)
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == "step-2"
    [(authorization, sent)] = worker_server.calls
    assert authorization == f"Bearer {order['token']}" and sent == {"model": "2", **ASK}

    # The worker stops answering (it died): the call drops its row, the next asks again.
    await worker_server.stop()
    gone = await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
    assert gone.status_code == 503
    assert await servers(api) == []
    await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
    assert len(api.dispatcher.served) == 2
    again = api.dispatcher.served[1][0]
    replaced = await api.client.get(route, headers=bearer(order))
    assert replaced.status_code == 404  # a worker taking the first order now skips it

    # A worker that cannot load it says why; the next call reads it, and asks again after.
    failed = await api.client.post(
        f"/internal/serving/{again['server_id']}/failed",
        json={"error": "CheckpointError: no array 'w'"},
        headers=bearer(again),
    )
    assert failed.status_code == 204
    told = await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
    assert told.status_code == 409 and "no array 'w'" in told.text
    await api.client.post(url, json={"model": "latest", **ASK}, headers=auth)
    last = api.dispatcher.served[2][0]
    assert len(api.dispatcher.served) == 3

    # Idle, the worker deregisters: the row is gone.
    stopped = await api.client.delete(
        f"/internal/serving/{last['server_id']}", headers=bearer(last)
    )
    assert stopped.status_code == 204 and await servers(api) == []


async def test_a_body_that_is_not_a_json_object_is_refused_naming_it(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    url = f"/v1/runs/{run_id}/chat/completions"
    for body in (b"not json", json.dumps([1]).encode()):
        answer = await api.client.post(url, content=body, headers=auth)
        assert answer.status_code == 400 and answer.json()["error"]["field"] == "body", answer.text


def bearer(order: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {order['token']}"}
