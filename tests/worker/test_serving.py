"""A served checkpoint's server (worker/serving.py) over real HTTP on loopback: its secret,
the sessions gateway's answers and refusals, the step's name on each answer, and its stop
once idle. The engine is `ScriptedEngine` (chosen token ids, no model); restoring a real
checkpoint is tests/e2e/test_serving.py's."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.session import SessionConfig
from worker.serving import Served, serve_until_idle

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
