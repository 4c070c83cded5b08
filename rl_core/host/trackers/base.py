"""The `Tracker` protocol: one experiment tracker a run's metrics are mirrored to.

A tracker is driven by the mirror's thread for its kind (`rl_core.host.trackers.mirror`),
never by the pipeline: each method may block on the network or the disk. ``open`` runs
before the first ``log`` (and again after an ``open`` that raised); a method that raises
`TrackerError` with ``permanent=True`` is not retried (a server that refuses the data
itself), any other exception is (a server down, a timeout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

# How the run ended, as the tracker records it.
Outcome = Literal["succeeded", "failed", "cancelled"]
StepMetrics = tuple[int, Mapping[str, float]]


class TrackerError(Exception):
    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Tracker(Protocol):
    kind: str

    def open(self) -> None: ...

    def log(self, steps: Sequence[StepMetrics]) -> None:
        """Record each (step, metrics) pair, in step order."""

    def close(self, outcome: Outcome) -> None: ...


__all__ = ["Outcome", "StepMetrics", "Tracker", "TrackerError"]
