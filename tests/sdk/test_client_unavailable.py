"""The client's answer to 503 + Retry-After: reads wait and try again, writes do not."""

from __future__ import annotations

import httpx
import pytest

from sdk.client import Client
from sdk.errors import ServerError


def _unavailable_then_ok(down: int, calls: list[str]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) <= down:
            body = {"error": {"code": "unavailable", "message": "the database is unreachable"}}
            return httpx.Response(503, json=body, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    return httpx.MockTransport(answer)


def test_a_read_answered_503_is_tried_again_as_retry_after_says() -> None:
    calls: list[str] = []
    with Client("http://api", "key", transport=_unavailable_then_ok(3, calls)) as client:
        assert client.list_environments() == []
    assert calls == ["GET"] * 4


def test_a_write_answered_503_raises_at_once() -> None:
    calls: list[str] = []
    with (
        Client("http://api", "key", transport=_unavailable_then_ok(3, calls)) as client,
        pytest.raises(ServerError, match="database is unreachable"),
    ):
        client.cancel("run_1")
    assert calls == ["POST"]


def test_reads_give_up_after_the_retry_budget() -> None:
    calls: list[str] = []
    transport = _unavailable_then_ok(10**6, calls)
    with (
        Client("http://api", "key", transport=transport, unavailable_retry_s=0.3) as client,
        pytest.raises(ServerError),
    ):
        client.list_environments()
    assert len(calls) >= 2
