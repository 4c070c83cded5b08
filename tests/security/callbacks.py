"""A webhook run whose worker waits on deferred results, and the environment's signed posts.

What an attacker of the callback route can hold is what travels on the wire: a
result the environment signed and posted (captured in flight, its signature good for
five minutes), and the route itself, which takes no API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from rl_core.protocol.signing import HEADER, sign
from tests.app.conftest import Api, lease

SECRET = "security-secret-0123456789abcdef"
# The result an attacker would most like to move: the episode ends, at full reward.
WINNING = {"messages": [], "reward": 1.0, "done": True, "info": {}}


@dataclass
class WebhookRun:
    api: Api
    auth: dict[str, str]
    env_id: str
    run_id: str

    def episode(self, local: str = "g0-e0") -> str:
        return f"{self.run_id}~a1-{local}"  # as worker/job.py names them


async def webhook_run(
    api: Api, *, auth: dict[str, str] | None = None, env_id: str = ""
) -> WebhookRun:
    """A claimed run on a registered environment (a new tenant and environment unless given)."""
    auth = auth or await api.tenant()
    if not env_id:
        r = await api.client.post(
            "/v1/environments",
            json={"name": "deferred", "url": "http://127.0.0.1:9/env", "secret": SECRET},
            headers=auth,
        )
        assert r.status_code == 201, r.text
        env_id = r.json()["id"]
    run_id = await api.submit(auth, environment={"name": env_id})
    claimed = await api.internal(run_id, "claim", worker_id=f"w-{run_id}")
    assert claimed.status_code == 200, claimed.text
    return WebhookRun(api, auth, env_id, run_id)


def signed_result(
    episode_id: str, step: int, result: dict[str, Any] = WINNING
) -> tuple[bytes, str]:
    """The bytes an environment posts for ``(episode_id, step)`` and their signature header:
    the step answer, naming the step it answers (docs/environment-protocol.md)."""
    raw = json.dumps({"episode_id": episode_id, "step": step, **result}).encode()
    return raw, sign(SECRET, raw)


async def post(
    client: httpx.AsyncClient, episode_id: str, step: int, raw: bytes, header: str | None
) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers[HEADER] = header
    return await client.post(f"/v1/env-callbacks/{episode_id}/{step}", content=raw, headers=headers)


async def poll(api: Api, run_id: str, episode_id: str, step: int, wait_s: float) -> httpx.Response:
    """The worker's long-poll for a deferred result (worker/callbacks.py), with the lease
    token of the run's claim."""
    return await api.client.get(
        f"/internal/runs/{run_id}/env-callbacks/{episode_id}/{step}",
        params={"wait_s": wait_s},
        headers=lease(api.leases[run_id]),
    )


@contextlib.asynccontextmanager
async def worker_waits(
    run: WebhookRun, episode_id: str, step: int
) -> AsyncIterator[asyncio.Task[httpx.Response]]:
    """The worker long-polling for ``(episode_id, step)``, as it does after a 202 to /step."""
    # The environment's post may still come before this poll does: the control plane
    # holds it for the poll (callback_await_grace_s), as it must when a post follows
    # its 202 at once.
    task = asyncio.create_task(poll(run.api, run.run_id, episode_id, step, wait_s=30))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
