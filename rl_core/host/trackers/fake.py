"""An in-memory `Tracker` whose failures a test decides: down, failing, slow."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rl_core.host.trackers.base import Outcome, StepMetrics, TrackerError


class FakeTracker:
    """Records what it is sent.

    ``failures``: calls (``open`` and ``log`` together) that raise before the next one
    succeeds; ``permanent`` makes them `TrackerError(permanent=True)`. ``gate``: when
    set to a cleared event, every ``log`` blocks until it is set (a hung server).
    ``missing_library``: ``open`` raises `ModuleNotFoundError`, as on a worker without
    the ``trackers`` extra.
    """

    def __init__(
        self,
        kind: str = "fake",
        *,
        failures: int = 0,
        permanent: bool = False,
        gate: threading.Event | None = None,
        missing_library: bool = False,
    ) -> None:
        self.kind = kind
        self.failures = failures
        self.permanent = permanent
        self.gate = gate
        self.missing_library = missing_library
        self.opened = 0
        self.calls = 0
        self.steps: list[StepMetrics] = []
        self.outcome: Outcome | None = None
        self.entered = threading.Event()  # set once a log call has started

    def open(self) -> None:
        if self.missing_library:  # a worker without the library this kind needs
            raise ModuleNotFoundError("No module named 'fake_tracker_library'")
        self._maybe_fail()
        self.opened += 1

    def log(self, steps: Sequence[StepMetrics]) -> None:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        self._maybe_fail()
        self.steps.extend((step, dict(metrics)) for step, metrics in steps)

    def close(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise TrackerError("the fake tracker is down", permanent=self.permanent)


__all__ = ["FakeTracker"]
