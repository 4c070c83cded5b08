"""Metric sinks that report a run's steps to the control plane.

Points are buffered and sent in batches, each with a per-run sequence number.
A batch that fails stays in the buffer under the same number and is sent again
later, so the API stores every point exactly once even across retries and
outages (it deduplicates on ``(run, seq)``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from worker.api_client import ApiUnavailable, ControlPlane

log = logging.getLogger(__name__)


class HttpMetricsSink:
    """An ``rl_core`` step sink that ships metrics to ``/internal/runs/{id}/metrics``."""

    def __init__(
        self, api: ControlPlane, run_id: str, *, first_seq: int = 0, batch_points: int = 2000
    ) -> None:
        self._api = api
        self._run_id = run_id
        self._batch_points = batch_points
        self._next_seq = first_seq
        self._pending: list[tuple[int, list[dict[str, Any]]]] = []  # (seq, points), oldest first
        self._open: list[dict[str, Any]] = []

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            if not math.isfinite(value):
                # JSON has no NaN; a diverged loss is visible as a gap plus this log line.
                log.warning("step %d: %s is %s; not sent", step, name, value)
                continue
            self._open.append({"step": step, "name": name, "value": float(value)})
        self._seal()
        self._send(give_up_quietly=True)

    def flush(self) -> None:
        """Send everything; raises ApiUnavailable if the API stays away."""
        self._seal()
        self._send(give_up_quietly=False)

    @property
    def pending_batches(self) -> int:
        return len(self._pending)

    def _seal(self) -> None:
        while self._open:
            batch, self._open = self._open[: self._batch_points], self._open[self._batch_points :]
            self._pending.append((self._next_seq, batch))
            self._next_seq += 1

    def _send(self, *, give_up_quietly: bool) -> None:
        while self._pending:
            seq, points = self._pending[0]
            try:
                # During training a short budget: a missing API must not stall
                # the trainer; the batch waits in the buffer instead.
                budget = 2.0 if give_up_quietly else None
                self._api.send_metrics(self._run_id, seq, points, retry_seconds=budget)
            except ApiUnavailable:
                if give_up_quietly:
                    # Training goes on; the batch is retried after the next step.
                    log.warning("metrics batch %d buffered: control plane unavailable", seq)
                    return
                raise
            self._pending.pop(0)
