"""How many requests one environment server gets at once: AIMD, as TCP does for packets.

A server written by others may take far fewer concurrent requests than the run
sends: a stdlib ``ThreadingHTTPServer`` accepts 5 pending connections and drops
or stalls the rest. Sent 128 at once, it times out or resets most of them; with
a fixed limit every retry hits the same wall, the breaker opens and the failure
budget is spent in seconds. So the worker treats the server's signs of overload
(no connection, a reset, a timeout, ``429``/``503``) as a congestion signal:

- the limit starts at the registered ``max_concurrency`` (never above it);
- each success adds ``1/limit`` (one more request in flight per limit's worth of
  successes: additive increase);
- an overload halves it, not below 1 (multiplicative decrease), at most once per
  *window*: a request remembers how many cuts there had been when it was let
  through, and only one let through since the last cut can cut again. The
  requests that were in flight when the limit fell were sent under the old limit;
  their failures say nothing new (TCP's one cut per round trip).

Whether an overload counts as a failure (towards the breaker, the call's retries
and so the failure budget) is decided here too: it does not when the limit was
lowered because of it or while it was in flight, since the request is then retried
under a lower limit, which is the answer to overload. It counts when the limit was
already at its floor for the whole request: one request at a time still fails, so
the server is down, not busy. Other failures (a ``500``, a wrong answer) never move
the limit: they say nothing about load.

Windows are counted in requests, not seconds, so no clock is needed and the
controller behaves the same on a slow machine as on a fast one. `AimdLimit` is the
pure bookkeeping; `AdaptiveSlots` lets requests wait (FIFO) for a permit under it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Literal

Verdict = Literal["absorbed", "counted"]


class AimdLimit:
    """The limit on requests in flight to one server, and the requests in flight."""

    def __init__(self, ceiling: int, *, floor: int = 1, decrease: float = 0.5) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got floor={floor} ceiling={ceiling}")
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {decrease}")
        self.ceiling = ceiling
        self.floor = floor
        self.decrease = decrease
        self.limit = float(ceiling)  # fractional: additive increase adds 1/limit per success
        self.in_flight = 0
        self.cuts = 0  # also the window: a request's epoch is the cuts made before it went out
        self.lowest = ceiling  # the lowest permits since `take_lowest`

    @property
    def permits(self) -> int:
        """Requests that may be in flight now."""
        return max(self.floor, int(self.limit))

    def can_admit(self) -> bool:
        return self.in_flight < self.permits

    def admit(self) -> int:
        """Count a request in flight; returns its epoch, to hand back when it ends."""
        self.in_flight += 1
        return self.cuts

    def succeeded(self, epoch: int) -> None:
        self._end()
        self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)

    def overloaded(self, epoch: int) -> Verdict:
        """The request ended in a sign of overload. ``absorbed``: the limit was lowered
        for it (now, or while it was in flight), so retry it without counting a failure.
        ``counted``: the limit was at its floor all along, so it is an ordinary failure."""
        self._end()
        if epoch != self.cuts:
            return "absorbed"  # sent under a limit that has been lowered since
        if self.permits <= self.floor:
            return "counted"
        self.limit = max(float(self.floor), self.limit * self.decrease)
        self.cuts += 1
        self.lowest = min(self.lowest, self.permits)
        return "absorbed"

    def ended(self, epoch: int) -> None:
        """The request ended with nothing to say about load (a 4xx, a 500, cancelled)."""
        self._end()

    def take_lowest(self) -> int:
        """The lowest permits since the last call (a metric per step), then start over."""
        lowest, self.lowest = self.lowest, self.permits
        return lowest

    def _end(self) -> None:
        if self.in_flight <= 0:
            raise RuntimeError("a request ended that was never admitted")
        self.in_flight -= 1


class AdaptiveSlots:
    """Permits under an `AimdLimit`, handed out first come, first served; one per event loop.

    `acquire` waits for one (bound it with ``asyncio.timeout``); each permit is given
    back once, through `succeeded`, `overloaded` or `ended`, which also wake waiters
    when the limit allows.
    """

    def __init__(self, limit: AimdLimit) -> None:
        self.limit = limit
        self._waiters: collections.deque[asyncio.Future[int]] = collections.deque()

    async def acquire(self) -> int:
        """Wait for a permit; its epoch."""
        if not self._waiters and self.limit.can_admit():
            return self.limit.admit()
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.ended(waiter.result())  # granted as it was cancelled: give it back
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it already
                    self._waiters.remove(waiter)
            raise

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def succeeded(self, epoch: int) -> None:
        self.limit.succeeded(epoch)
        self._wake()

    def overloaded(self, epoch: int) -> Verdict:
        verdict = self.limit.overloaded(epoch)
        self._wake()
        return verdict

    def ended(self, epoch: int) -> None:
        self.limit.ended(epoch)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.limit.can_admit():
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self.limit.admit())


__all__ = ["AdaptiveSlots", "AimdLimit", "Verdict"]
