"""A file a run needs before training, streamed from the control plane behind its lease.

Datasets (worker/datasets.py) and starting adapters (worker/init_from.py) come the same
way: ``GET /internal/runs/{id}/...`` with the run's lease token, so any host can fetch
them; a 5xx, a 429 or a dropped connection is retried with backoff up to a deadline, any
other refusal ends the fetch with the control plane's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

log = logging.getLogger(__name__)

CHUNK = 1 << 16
T = TypeVar("T")


class Transient(Exception):
    """A refusal worth another try (5xx, 429)."""


class LeasedFetch:
    def __init__(
        self,
        api_url: str,
        lease_token: str,
        *,
        retry_seconds: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._base = api_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {lease_token}"}
        self._retry_seconds = retry_seconds
        self._transport = transport

    def retrying(
        self, what: str, attempt: Callable[[], T], give_up: Callable[[str], Exception]
    ) -> T:
        """``attempt()`` until it succeeds, retrying transient failures until the deadline."""
        deadline = time.monotonic() + self._retry_seconds
        delay = 0.5
        while True:
            try:
                return attempt()
            except (httpx.TransportError, Transient) as exc:
                if time.monotonic() + delay > deadline:
                    raise give_up(f"{what}: gave up: {exc}") from exc
                log.warning("fetching %s failed (%s); retrying", what, exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def stream_to(
        self,
        path: str,
        out: Path,
        refused: Callable[[str], Exception],
        on_chunk: Callable[[bytes], None] | None = None,
    ) -> None:
        """Write the answer of ``GET {api}{path}`` to ``out``; a refusal that is not
        transient raises ``refused("HTTP <status>: <the control plane's message>")``."""
        with (
            httpx.Client(headers=self._headers, transport=self._transport, timeout=60) as http,
            http.stream("GET", f"{self._base}{path}") as response,
        ):
            if response.status_code >= 500 or response.status_code == 429:
                raise Transient(f"HTTP {response.status_code}")
            if response.status_code != 200:
                response.read()
                raise refused(f"HTTP {response.status_code}: {_message(response)}")
            with out.open("wb") as f:
                for chunk in response.iter_bytes(CHUNK):
                    if on_chunk is not None:
                        on_chunk(chunk)
                    f.write(chunk)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
