"""The metrics stream over a real uvicorn server on loopback, on real Postgres.

Streams are read with httpx over TCP (ASGITransport buffers whole responses).
Two app instances on one database stand for two API processes: a stream on
one hears what the other stored, through LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from app.live.fanout import Note
from app.live.notes import PostgresListener
from tests.app.conftest import Api, plain, running_api

pytestmark = pytest.mark.anyio
TIMEOUT = httpx.Timeout(30.0)


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """``app`` behind uvicorn on a free loopback port; its lifespan is already running."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="off", log_level="warning", timeout_graceful_shutdown=1)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 (uvicorn has no started event)
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class Events:
    """Reads server-sent events off an open httpx stream, one at a time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.comments: list[str] = []
        self.commented = asyncio.Event()

    async def next(self) -> dict[str, Any] | None:
        """The next event as {id?, event, data}; None when the stream has ended."""
        fields: dict[str, Any] = {}
        async for line in self._lines:
            if not line:
                if "event" in fields:
                    fields["data"] = json.loads(fields["data"])
                    return fields
                fields = {}  # a block without an event: the retry hint
                continue
            if line.startswith(":"):
                self.comments.append(line)
                self.commented.set()
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        return None

    async def take(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            event = await asyncio.wait_for(self.next(), 20)
            assert event is not None, f"the stream ended after {out}"
            out.append(event)
        return out


@contextlib.asynccontextmanager
async def stream(base: str, run_id: str, auth: dict[str, str], **kw: Any) -> AsyncIterator[Events]:
    url = f"/v1/runs/{run_id}/metrics/stream"
    headers = auth | kw.pop("headers", {})
    async with (
        httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as client,
        client.stream("GET", url, headers=headers, **kw) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Events(response)


async def running(api: Api) -> tuple[dict[str, str], str]:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.internal(run_id, "status", worker_id="w1", status="running")
    return auth, run_id


async def post_steps(api: Api, run_id: str, seq: int, *steps: int) -> None:
    points = [
        point
        for s in steps
        for point in ({"step": s, "name": "loss", "value": 1 / s},
                      {"step": s, "name": "reward", "value": s / 10})
    ]  # fmt: skip
    r = await api.internal(run_id, "metrics", worker_id="w1", seq=seq, points=points)
    assert r.status_code == 200, r.text


def steps_of(events: list[dict[str, Any]]) -> list[int]:
    return [e["data"]["step"] for e in events if e["event"] == "metrics"]


async def test_a_stream_resumes_after_last_event_id_and_ends_with_the_run(api: Api) -> None:
    auth, run_id = await running(api)
    await post_steps(api, run_id, 0, 1, 2, 3)
    async with serving(api.app) as base:
        async with stream(base, run_id, auth) as events:
            first = await events.take(4)
            assert steps_of(first) == [1, 2, 3] and [e["id"] for e in first[:3]] == ["1", "2", "3"]
            assert first[0]["data"] == {"step": 1, "metrics": {"loss": 1.0, "reward": 0.1}}
            assert first[3] == {"event": "status", "data": {"status": "running"}}
            await post_steps(api, run_id, 1, 4)  # live
            (live,) = await events.take(1)
            assert live["id"] == "4" and live["data"]["metrics"] == {"loss": 0.25, "reward": 0.4}
        await post_steps(api, run_id, 2, 5)  # while nobody listens
        await post_steps(api, run_id, 3, 6)
        async with stream(base, run_id, auth, headers={"Last-Event-ID": "4"}) as events:
            again = await events.take(3)
            assert steps_of(again) == [5, 6] and again[2]["data"] == {"status": "running"}
            await api.internal(run_id, "status", worker_id="w1", status="succeeded")
            assert await events.take(1) == [{"event": "status", "data": {"status": "succeeded"}}]
            assert await asyncio.wait_for(events.next(), 20) is None  # terminal and drained
        # A finished run's stream sends what there is and ends at once.
        async with stream(base, run_id, auth, params={"after_step": 4}) as events:
            done = await events.take(3)
            assert steps_of(done) == [5, 6] and done[2]["data"] == {"status": "succeeded"}
            assert await asyncio.wait_for(events.next(), 20) is None


async def test_last_event_id_wins_over_after_step_and_a_bad_one_is_400(api: Api) -> None:
    auth, run_id = await running(api)
    await post_steps(api, run_id, 0, 1, 2, 3)
    await api.internal(run_id, "status", worker_id="w1", status="succeeded")
    async with serving(api.app) as base:
        async with stream(
            base, run_id, auth, params={"after_step": 0}, headers={"Last-Event-ID": "2"}
        ) as events:
            assert steps_of(await events.take(2)) == [3]
        async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as client:
            url = f"/v1/runs/{run_id}/metrics/stream"
            for headers, params, field in (
                ({"Last-Event-ID": "soon"}, {}, "Last-Event-ID"),
                ({"Last-Event-ID": "-5"}, {}, "Last-Event-ID"),
                ({}, {"after_step": -2}, "after_step"),
            ):
                r = await client.get(url, headers=auth | headers, params=params)
                assert r.status_code in (400, 422), r.text
                assert r.json()["error"]["field"] == field


async def test_a_quiet_stream_sends_keep_alives(app_database: str) -> None:
    async with running_api(app_database, stream_keepalive_s=0.2) as api:
        auth, run_id = await running(api)
        async with serving(api.app) as base, stream(base, run_id, auth) as events:
            assert await events.take(1) == [{"event": "status", "data": {"status": "running"}}]
            waiter = asyncio.create_task(events.next())
            await asyncio.wait_for(events.commented.wait(), 20)
            assert events.comments[0] == ": keep-alive"
            await post_steps(api, run_id, 0, 1)
            assert (await asyncio.wait_for(waiter, 20) or {}).get("id") == "1"


async def test_two_api_processes_hear_each_others_notes(app_database: str) -> None:
    """What one instance stores reaches a stream opened on another, by NOTIFY alone."""
    # resync_s an hour: only a note can wake the second instance's feed.
    async with running_api(app_database) as a, running_api(app_database, stream_resync_s=3600) as b:
        heard: asyncio.Queue[Note] = asyncio.Queue()
        listener = PostgresListener(
            plain(app_database), lambda notes: [heard.put_nowait(n) for n in notes], lambda: None
        )
        await listener.start()
        try:
            auth, run_id = await running(a)
            async with serving(b.app) as base, stream(base, run_id, auth) as events:
                assert (await events.take(1))[0]["data"] == {"status": "running"}
                await post_steps(a, run_id, 0, 1, 2)
                assert steps_of(await events.take(2)) == [1, 2]
                await a.internal(run_id, "status", worker_id="w1", status="succeeded")
                assert (await events.take(1))[0]["data"] == {"status": "succeeded"}
            # A third listener heard the same: the newest step of the batch, then the status.
            notes: list[Note] = []
            while Note(run_id=run_id, step=2) not in notes:
                notes.append(await asyncio.wait_for(heard.get(), 20))
            after = await asyncio.wait_for(heard.get(), 20)
        finally:
            await listener.close()
    assert after == Note(run_id=run_id, status=True)


async def test_a_failed_request_sends_no_note(api: Api, app_database: str) -> None:
    heard: asyncio.Queue[Note] = asyncio.Queue()
    listener = PostgresListener(
        plain(app_database), lambda notes: [heard.put_nowait(n) for n in notes], lambda: None
    )
    await listener.start()
    try:
        _, run_id = await running(api)
        # Rolled back: a post from a worker without the lease, and a duplicate-free 422.
        r = await api.internal(run_id, "metrics", worker_id="intruder", seq=0, points=[])
        assert r.status_code == 409
        await post_steps(api, run_id, 0, 7)
        notes = []
        while not any(n.step == 7 for n in notes):
            notes.append(await asyncio.wait_for(heard.get(), 20))
    finally:
        await listener.close()
    # Only the status notes of the run's start, then the one batch that committed.
    assert [n.step for n in notes if n.run_id == run_id and n.step is not None] == [7]
