"""What keeps a flaky environment server from hurting a run: breaker, budget, backoff.

Pure bookkeeping over a monotonic clock; `WebhookEnvironment` calls into it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Per endpoint. ``closed``: calls go through; after ``threshold`` consecutive
    failures it is ``open`` and calls fail fast (no request) for ``cooldown_s``;
    then one probe call goes through (``half_open``): success closes it, failure
    opens it for another cool-down. Failing fast matters because every call to
    a dead server otherwise waits out its timeout and retries, holding episode
    slots that healthy work could use."""

    def __init__(
        self,
        threshold: int,
        cooldown_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.state: BreakerState = "closed"
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self._probing = False
        self.opened = 0  # times it opened (a failed probe opens it again), for metrics
        self.closed = 0  # times a success closed it

    def allow(self) -> bool:
        """May a call go out now? In half-open, only one (the probe) may."""
        if self.state == "open" and self.clock() - self.opened_at >= self.cooldown_s:
            self.state, self._probing = "half_open", False
        if self.state == "closed":
            return True
        if self.state == "half_open" and not self._probing:
            self._probing = True
            return True
        return False

    def holds_calls(self) -> bool:
        """Would `allow` refuse now (open and cooling down, or a probe out)? Asks, changes
        nothing."""
        if self.state == "open":
            return self.clock() - self.opened_at < self.cooldown_s
        return self.state == "half_open" and self._probing

    def retry_in_s(self) -> float:
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())

    def record_success(self) -> None:
        if self.state != "closed":
            self.closed += 1
        self.state, self.consecutive_failures, self._probing = "closed", 0, False

    def abandon(self) -> None:
        """The call that was let through ended with no verdict (it was cancelled)."""
        self._probing = False

    def record_failure(self) -> None:
        self.consecutive_failures += 1
        if self.state == "half_open" or self.consecutive_failures >= self.threshold:
            if self.state != "open":
                self.opened += 1
            self.state, self.opened_at, self._probing = "open", self.clock(), False


class FailureBudget:
    """Counts episodes started and failed (each failed episode once)."""

    def __init__(self, fraction: float, minimum: int) -> None:
        self.fraction = fraction
        self.minimum = minimum
        self.started = 0
        self.failed = 0
        self.last_error = ""
        self._failed_open: set[str] = set()  # failed episodes not closed yet

    @property
    def allowed(self) -> int:
        return max(self.minimum, int(self.fraction * self.started))

    @property
    def exhausted(self) -> bool:
        return self.failed > self.allowed

    def start(self) -> None:
        self.started += 1

    def fail(self, episode_id: str, error: str) -> None:
        self.last_error = error
        if episode_id not in self._failed_open:
            self._failed_open.add(episode_id)
            self.failed += 1

    def close(self, episode_id: str) -> None:
        self._failed_open.discard(episode_id)


def backoff_s(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, so retries
    from many episodes that failed together do not arrive together again."""
    ceiling = min(max_s, base_s * 2.0**attempt)
    return ceiling / 2 + rng.uniform(0, ceiling / 2)
