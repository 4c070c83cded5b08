"""Deferred webhook results, fetched from the control plane.

An environment that answers a step with ``202 {"deferred": true}`` later posts
the result to the control plane (``/v1/env-callbacks/...``), which holds it
for the worker. This is the worker's side of that relay: an
``rl_core.envs.webhook.CallbackSource`` that long-polls
``/internal/runs/{id}/env-callbacks/{episode_id}/{step}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

log = logging.getLogger(__name__)

POLL_S = 25.0  # one long-poll; below common proxy idle timeouts


class HttpCallbackSource:
    def __init__(self, api_url: str, token: str, run_id: str) -> None:
        """``token``: the run's lease token (the claim's answer), the poll's credential. A
        poll refused for it (403: the lease ended) backs off like any failure until the
        step's deadline; meanwhile the heartbeat, refused too, stops the pipeline."""
        self._base = api_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._run_id = run_id

    async def wait(self, episode_id: str, step: int, timeout_s: float) -> Mapping[str, Any] | None:
        """The posted result of ``(episode_id, step)``, or None if none came within timeout_s."""
        deadline = time.monotonic() + timeout_s
        url = (
            f"{self._base}/internal/runs/{self._run_id}/env-callbacks/"
            f"{quote(episode_id, safe='')}/{step}"
        )
        delay = 0.2
        # A client per wait: it belongs to the calling event loop, and deferred steps are rare.
        async with httpx.AsyncClient(headers=self._headers) as http:
            while (left := deadline - time.monotonic()) > 0:
                wait_s = min(POLL_S, left)
                try:
                    response = await http.get(
                        url, params={"wait_s": f"{wait_s:.1f}"}, timeout=wait_s + 10
                    )
                except httpx.TransportError as exc:
                    log.warning("waiting for %s/%d: %s; retrying", episode_id, step, exc)
                    await asyncio.sleep(min(delay, max(left, 0)))
                    delay = min(delay * 2, 5.0)
                    continue
                if response.status_code == 200:
                    body: Mapping[str, Any] = response.json()["body"]
                    return body
                if response.status_code != 204:
                    log.warning(
                        "waiting for %s/%d: HTTP %d %s",
                        episode_id,
                        step,
                        response.status_code,
                        response.text[:200],
                    )
                    await asyncio.sleep(min(delay, max(left, 0)))
                    delay = min(delay * 2, 5.0)
        return None


__all__ = ["HttpCallbackSource"]
