"""Where deferred step results come from, and an in-memory fake of it.

A webhook step that answers ``202 {"deferred": true}`` delivers its result
later by POSTing it to the control plane; the worker fetches it through a
`CallbackSource` (``worker/callbacks.py`` long-polls
``GET /internal/runs/{id}/env-callbacks/{episode_id}/{step}``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any, Protocol


class CallbackSource(Protocol):
    async def wait(self, episode_id: str, step: int, timeout_s: float) -> Mapping[str, Any] | None:
        """The result body of a deferred step, or None if none came within ``timeout_s``."""
        ...


class MemoryCallbacks:
    """A `CallbackSource` fed by `deliver`, which any thread may call (a test's
    relay server runs on its own event loop). A result delivered before
    anyone waits is kept until it is taken; each result is taken once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[tuple[str, int], Mapping[str, Any]] = {}
        self._waiters: dict[tuple[str, int], tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self.delivered: list[tuple[str, int]] = []

    def deliver(self, episode_id: str, step: int, body: Mapping[str, Any]) -> None:
        key = (episode_id, step)
        with self._lock:
            self._ready[key] = body
            self.delivered.append(key)
            waiter = self._waiters.get(key)
        if waiter is not None:
            loop, event = waiter
            loop.call_soon_threadsafe(event.set)

    async def wait(self, episode_id: str, step: int, timeout_s: float) -> Mapping[str, Any] | None:
        key = (episode_id, step)
        event = asyncio.Event()
        with self._lock:
            if key in self._ready:
                return self._ready.pop(key)
            self._waiters[key] = (asyncio.get_running_loop(), event)
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        with self._lock:
            self._waiters.pop(key, None)
            return self._ready.pop(key, None)
