"""Where a run's reports go: the `RunSink` protocol and the sinks that ship with rl_core.

The pipeline calls a sink from its event-loop thread, between awaits, so a
sink must be quick: buffer, and do slow I/O in batches (the worker's HTTP sink
sends at most one batch per call and keeps the rest for later). Spans and
trajectories arrive in batches, at least once per step.

`MemorySink` (tests, notebooks) keeps everything in memory. The files of
``rlaas train --out DIR`` (`rl_core.pipeline.files.RunFiles`) and the worker's
control-plane sink implement the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from rl_core.records import CheckpointRecord, Span, TrajectoryRecord


class RunSink(Protocol):
    def on_step(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def on_spans(self, spans: Sequence[Span]) -> None: ...

    def on_trajectories(self, records: Sequence[TrajectoryRecord]) -> None: ...

    def on_checkpoint(self, record: CheckpointRecord) -> None: ...


class MemorySink:
    """Keeps every record in memory."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.spans: list[Span] = []
        self.trajectories: list[TrajectoryRecord] = []
        self.checkpoints: list[CheckpointRecord] = []

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps.append((step, dict(metrics)))

    def on_spans(self, spans: Sequence[Span]) -> None:
        self.spans.extend(spans)

    def on_trajectories(self, records: Sequence[TrajectoryRecord]) -> None:
        self.trajectories.extend(records)

    def on_checkpoint(self, record: CheckpointRecord) -> None:
        self.checkpoints.append(record)


__all__ = ["MemorySink", "RunSink"]
