"""A served checkpoint's server (worker/serving.py) over real HTTP on loopback: its secret,
the sessions gateway's answers and refusals, the step's name on each answer, and its stop
once idle. The engine is `ScriptedEngine` (chosen token ids, no model); restoring a real
checkpoint is tests/e2e/test_serving.py's; failing to is here, against a loopback
stand-in for the API's routes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.session import SessionConfig
from worker.serving import Served, serve_checkpoint, serve_until_idle
from worker.settings import WorkerSettings

IDLE_S = 1.0
ASK = {"model": "latest", "messages": [{"role": "user", "content": "2 + 5?"}]}


def served() -> Served:
    tok = BuiltinTokenizer()
    reply = [*tok.encode("7"), tok.end_of_turn_id]
    engine = ScriptedEngine([reply] * 4, stop_ids=[tok.end_of_turn_id])
    config = SessionConfig(sampling=SamplingParams(temperature=1.0), max_new_tokens=16)
    return Served(engine, tok, config, name="step-3")


async def scenario() -> float:
    urls: list[str] = []
    loop, ready = asyncio.get_running_loop(), asyncio.Event()

    def registered(url: str) -> None:  # called off the loop, as the worker's POST is
        urls.append(url)
        loop.call_soon_threadsafe(ready.set)

    server = asyncio.create_task(
        serve_until_idle(
            served(),
            token="the-order-secret",
            host="127.0.0.1",
            idle_s=IDLE_S,
            public_url=None,
            registered=registered,
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    url = f"{urls[0]}/v1/chat/completions"
    secret = {"Authorization": "Bearer the-order-secret"}
    async with httpx.AsyncClient(timeout=10) as client:
        stranger = await client.post(url, json=ASK, headers={"Authorization": "Bearer guess"})
        assert stranger.status_code == 401
        assert stranger.json()["error"]["code"] == "invalid_api_key"

        answer = await client.post(url, json=ASK, headers=secret)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["model"] == "step-3" and body["choices"][0]["message"]["content"] == "7"

        wrong = await client.post(url, json={"model": "latest", "messages": []}, headers=secret)
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "messages"

        stream = await client.post(url, json={**ASK, "stream": True}, headers=secret)
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert '"model": "step-3"' in stream.text and stream.text.rstrip().endswith("[DONE]")
        last_call = time.monotonic()
    await asyncio.wait_for(server, 10 * IDLE_S)
    idle = time.monotonic() - last_call
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.ConnectError):
            await client.post(url, json=ASK, headers=secret)
    return idle


def test_the_server_answers_its_secret_as_the_gateway_does_and_stops_once_idle() -> None:
    idle = asyncio.run(scenario())
    assert IDLE_S * 0.9 <= idle < IDLE_S + 2, idle  # counted from the last call, not the start


class _ControlPlane(BaseHTTPRequestHandler):
    """The API's /internal/serving routes, remembering what the worker told them."""

    told: ClassVar[list[tuple[str, str, dict[str, Any]]]] = []

    def _record(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.told.append((self.command, self.path, body))
        self.send_response(204)
        self.end_headers()

    do_GET = do_POST = do_DELETE = _record

    def log_message(self, *args: Any) -> None:
        pass


def test_a_checkpoint_that_cannot_be_loaded_is_reported_without_the_workers_paths(
    tmp_path: Path,
) -> None:
    api = ThreadingHTTPServer(("127.0.0.1", 0), _ControlPlane)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        settings = WorkerSettings(
            api_url=f"http://127.0.0.1:{api.server_address[1]}", data_dir=tmp_path
        )
        missing = tmp_path / "artifacts" / "run_x" / "checkpoints" / "step-00000002"
        order = {
            "server_id": "srv_1",
            "token": "the-order-secret",
            "run_id": "run_x",
            "step": 2,
            "uri": str(missing),
            "spec": {"model": {"source": "builtin:tiny"}, "environment": {"name": "guess_number"}},
        }
        assert serve_checkpoint(order, settings) == "failed"
    finally:
        api.shutdown()
    asked, (method, path, body) = _ControlPlane.told
    assert asked[:2] == ("GET", "/internal/serving/srv_1")  # still wanted: loaded
    assert (method, path) == ("POST", "/internal/serving/srv_1/failed")
    assert body["error"].startswith("CheckpointError") and str(tmp_path) not in body["error"]
