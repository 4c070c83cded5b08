"""The run sink that reports a run to the control plane.

It implements ``rl_core.host.sinks.RunSink``: each call turns records into their
wire JSON and hands them to a `Shipper`, whose thread sends numbered batches
(see ``worker/shipper.py`` for the exactly-once rules). Nothing here blocks
the pipeline.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_core.records import CheckpointRecord, Span, TrajectoryRecord
from worker.api_client import ControlPlane, ControlPlaneError
from worker.shipper import Shipper

log = logging.getLogger(__name__)

# During training a short retry budget per send: the batch waits in the
# shipper and is tried again after a backoff, instead of tying up the thread.
SEND_RETRY_S = 2.0


class HttpRunSink:
    def __init__(
        self,
        api: ControlPlane,
        run_id: str,
        *,
        first_seq: int = 0,
        attempt: int = 0,
        resumed_from: tuple[int, int] = (0, 0),
        batch_points: int = 5000,
        batch_spans: int = 5000,
        batch_trajectories: int = 64,
        max_buffered_spans: int = 500_000,
        max_buffered_trajectories: int = 2_000,
        interval_s: float = 0.5,
        on_refused: Callable[[ControlPlaneError], None] | None = None,
    ) -> None:
        """``on_refused``: what to do once the control plane refuses a batch for good (a
        step it already holds from this attempt, a lease another worker holds now): the
        worker stops the run at once (worker.job), as nothing it trains can be reported."""
        self._api = api
        self._run_id = run_id
        # Every step the pipeline reports applied one policy update, to the policy of the
        # step before: the first one to the checkpoint this attempt resumed from, as
        # (step, the attempt that wrote it). Reported with the step's points (`UpdateIn`).
        self._attempt = attempt
        self._policy = resumed_from
        self._shipper = Shipper(
            self._send,
            first_seq=first_seq,
            lanes={
                "metrics": (batch_points, None),
                "artifacts": (1, None),
                "spans": (batch_spans, max_buffered_spans),
                "trajectories": (batch_trajectories, max_buffered_trajectories),
            },
            interval_s=interval_s,
            on_refused=on_refused,
        )

    # --- RunSink ----------------------------------------------------------------

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        points: list[dict[str, Any]] = _points(step, metrics)
        if step > 0 and self._attempt > 0:  # step 0: the evaluation before any update
            base_step, base_attempt = self._policy
            count = metrics.get("optimizer_updates")
            update = {
                "step": step,
                "attempt": self._attempt,
                "base_step": base_step,
                "base_attempt": base_attempt,
                "optimizer_updates": None if count is None else int(count),
            }
            points.append({_UPDATE: update})
            self._policy = (step, self._attempt)
        self._shipper.add("metrics", points, urgent=True)

    def on_spans(self, spans: Sequence[Span]) -> None:
        self._shipper.add("spans", [s.to_json() for s in spans])

    def on_trajectories(self, records: Sequence[TrajectoryRecord]) -> None:
        self._shipper.add("trajectories", [r.to_json() for r in records])

    def on_checkpoint(self, record: CheckpointRecord) -> None:
        self._shipper.add("artifacts", [{"kind": "checkpoint", **record.to_json()}], urgent=True)

    # --- the worker's side ----------------------------------------------------

    def add_points(self, step: int, metrics: Mapping[str, float]) -> None:
        """Report more points of an already reported ``step`` (the trackers' final
        counters), with no policy update: a point sent again overwrites."""
        self._shipper.add("metrics", _points(step, metrics), urgent=True)

    def flush(self, timeout_s: float) -> None:
        """Wait until everything is stored; raises ApiUnavailable (or LeaseLost) otherwise."""
        self._shipper.flush(timeout_s)

    def close(self) -> None:
        self._shipper.close()

    @property
    def pending(self) -> int:
        return self._shipper.pending()

    def dropped(self, kind: str) -> int:
        return self._shipper.dropped(kind)

    def _send(self, kind: str, seq: int, items: list[dict[str, Any]]) -> None:
        if kind == "artifacts":
            record = dict(items[0])
            self._api.record_artifact(
                self._run_id, record.pop("kind"), record, retry_seconds=SEND_RETRY_S
            )
            return
        extra = None
        if kind == "metrics":
            updates = [item[_UPDATE] for item in items if _UPDATE in item]
            items = [item for item in items if _UPDATE not in item]
            extra = {"updates": updates} if updates else None
        self._api.send_batch(
            self._run_id, kind, seq, items, retry_seconds=SEND_RETRY_S, extra=extra
        )


def _points(step: int, metrics: Mapping[str, float]) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for name, value in metrics.items():
        value = float(value)
        if not math.isfinite(value):
            # JSON has no NaN; a diverged loss shows as a gap plus this line.
            log.warning("step %d: %s is %s; not sent", step, name, value)
            continue
        points.append({"step": step, "name": name, "value": value})
    return points


# An update travels in the metrics lane, so it is stored in the same batch (and the same
# transaction) as its step's points.
_UPDATE = "update"


__all__ = ["HttpRunSink"]
