"""DNS rebinding against the API's environment check (``POST /v1/environments/{id}/check``).

The attacker's name answers an allowed address while it is checked (at registration,
and again by the check) and the metadata address to whoever asks next: the client
that connects. Before, the check resolved the name once more to connect (httpx does
its own lookup), so it reached 169.254.169.254. Now it connects to the address it
checked, with the name as Host: the lookup count shows there is no third one, and the
check reaches the real server on loopback.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.app.conftest import running_api
from tests.app.test_environments import SECRET, check
from tests.app.webhook_server import WebhookServer, serving

pytestmark = pytest.mark.anyio


@pytest.fixture
def webhook() -> Iterator[WebhookServer]:
    with serving(SECRET) as server:
        yield server


async def test_the_check_connects_to_the_address_it_checked(
    app_database: str, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo
    asked: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, bytes):  # httpx asks in IDNA bytes
            host = host.decode()
        if host != "rebind.attacker.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = "127.0.0.1" if len(asked) <= 2 else "169.254.169.254"
        return real(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    url = webhook.url("ok").replace("127.0.0.1", "rebind.attacker.test")
    async with running_api(app_database, env_url_allowlist="public,loopback") as api:
        result = await check(api, await api.tenant(), url)
    assert len(asked) == 2  # registration and the check; none when connecting
    assert result["ok"] is True, result  # it reached the checked address, loopback
    assert [path for _, path, _ in webhook.seen] == ["reset", "close"]
