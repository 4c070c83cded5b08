"""Mirror a run's step metrics to the trackers its spec names, off the pipeline's path.

The pipeline reports each step's metrics to its sink from the event-loop thread;
`MirroredSink` hands a copy to `TrackerMirror.submit`, which only appends to one
bounded queue per tracker and returns. Each tracker has its own thread (a slow MLflow
server never holds back the TensorBoard files) that sends what is queued in batches.

A tracker that is down or slow never slows or fails the run:

- a failed call is counted (``tracker/<kind>/errors``) and the batch tried again after
  an exponential backoff with jitter, up to ``retries`` times, then dropped;
- past ``max_pending`` steps queued, the oldest step is dropped (the freshest metrics
  matter most on a live chart);
- dropped steps are counted (``tracker/<kind>/dropped``), and these counters, with the
  steps still queued (``tracker/<kind>/pending``), travel with every later step's
  metrics to the run's own sink, so the run's metrics show what its trackers missed;
- `TrackerMirror.close` waits at most ``close_timeout_s`` for the queues of the
  trackers whose last call succeeded to drain, and not at all for one that is failing;
  what is left then is dropped and counted, and a thread stuck in a call is left
  behind (a daemon), never waited for.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rl_core.host.sinks import RunSink
from rl_core.host.trackers.base import Outcome, StepMetrics, Tracker, TrackerError
from rl_core.records import CheckpointRecord, Span, TrajectoryRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class MirrorConfig:
    max_pending: int = 1000  # steps queued per tracker; the oldest is dropped past it
    max_batch: int = 100  # steps per tracker call
    retries: int = 5  # further tries of a failed batch before it is dropped
    backoff_s: float = 0.5  # the first wait; doubled per failure, with jitter
    backoff_max_s: float = 30.0
    close_timeout_s: float = 30.0  # how long the end of a run waits for its trackers


class _Lane:
    """One tracker: its queue, its thread, its counters."""

    def __init__(self, tracker: Tracker, config: MirrorConfig) -> None:
        self.tracker = tracker
        self._config = config
        self._cond = threading.Condition()
        self._queue: deque[StepMetrics] = deque()
        self._in_flight = 0
        self.sent = 0
        self.errors = 0
        self.dropped = 0
        self._opened = False
        self._broken = False  # a permanent failure to open: everything after is dropped
        self.healthy = True  # the last call succeeded (or none was made yet)
        self._outcome: Outcome | None = None  # set by close
        self._deadline: float | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"tracker-{tracker.kind}", daemon=True
        )
        self._thread.start()

    # --- the pipeline's side: never blocks on the tracker ------------------------------

    def put(self, item: StepMetrics) -> None:
        with self._cond:
            if self._outcome is not None:
                return
            if len(self._queue) >= self._config.max_pending:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(item)
            self._cond.notify()

    def counters(self) -> dict[str, float]:
        kind = self.tracker.kind
        with self._cond:
            return {
                f"tracker/{kind}/errors": float(self.errors),
                f"tracker/{kind}/dropped": float(self.dropped),
                f"tracker/{kind}/pending": float(len(self._queue) + self._in_flight),
            }

    def close(self, outcome: Outcome, deadline: float) -> None:
        with self._cond:
            self._outcome = outcome
            self._deadline = deadline
            self._cond.notify_all()

    def join(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return True
        with self._cond:  # stuck in a call: what it has not sent is lost
            self.dropped += len(self._queue) + self._in_flight
            self._queue.clear()
            self._in_flight = 0
        log.warning("tracker %s: still busy at the end of the run; left behind", self.tracker.kind)
        return False

    # --- the lane's thread --------------------------------------------------------------

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            if batch:  # empty: a broken tracker's steps, dropped already
                self._deliver(batch)
            with self._cond:
                self._in_flight = 0
        if self._opened:
            try:
                self.tracker.close(self._outcome or "failed")
            except Exception:
                log.warning("tracker %s: closing failed", self.tracker.kind, exc_info=True)
                with self._cond:
                    self.errors += 1

    def _next_batch(self) -> list[StepMetrics] | None:
        with self._cond:
            while not self._queue and self._outcome is None:
                self._cond.wait()
            if not self._queue:
                return None  # closed and drained
            if self._broken or self._past_deadline():
                self.dropped += len(self._queue)
                self._queue.clear()
                return None if self._outcome is not None else []
            count = min(len(self._queue), self._config.max_batch)
            batch = [self._queue.popleft() for _ in range(count)]
            self._in_flight = count
            return batch

    def _deliver(self, batch: list[StepMetrics]) -> None:
        failures = 0
        while True:
            try:
                if not self._opened:
                    self._open()
                self.tracker.log(batch)
            except Exception as exc:
                failures += 1
                self.healthy = False
                permanent = self._broken or (isinstance(exc, TrackerError) and exc.permanent)
                with self._cond:
                    self.errors += 1
                if permanent or failures > self._config.retries:
                    self._give_up(batch, f"after {failures} failed tries: {exc}")
                    return
                log.info("tracker %s: try %d failed: %s", self.tracker.kind, failures, exc)
                self._sleep(self._backoff(failures))
                if self._past_deadline():  # the run has ended: no try after its deadline
                    self._give_up(batch, f"at the end of the run, after: {exc}")
                    return
            else:
                self.healthy = True
                with self._cond:
                    self.sent += len(batch)
                return

    def _give_up(self, batch: list[StepMetrics], why: str) -> None:
        with self._cond:
            # What is still counted in flight: `join` already counted a batch it abandoned.
            self.dropped += self._in_flight
            self._in_flight = 0
        log.warning(
            "tracker %s: steps %d-%d dropped %s", self.tracker.kind, batch[0][0], batch[-1][0], why
        )

    def _open(self) -> None:
        try:
            self.tracker.open()
        except ImportError as exc:  # a worker without the extra: retrying cannot help
            self._broken = True
            raise TrackerError(
                f"{exc}; install the trackers extra on the workers: pip install "
                "'rlaas[worker,trackers]'",
                permanent=True,
            ) from exc
        except TrackerError as exc:
            if exc.permanent:
                self._broken = True
            raise
        self._opened = True

    def _backoff(self, failures: int) -> float:
        base = min(self._config.backoff_max_s, self._config.backoff_s * 2.0 ** (failures - 1))
        return base * (0.5 + random.random() / 2)  # jitter: workers never retry in step

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until the close deadline if that comes first."""
        end = time.monotonic() + seconds
        with self._cond:
            while (left := end - time.monotonic()) > 0:
                if self._deadline is not None:
                    left = min(left, self._deadline - time.monotonic())
                    if left <= 0:
                        return
                self._cond.wait(left)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline


class TrackerMirror:
    """Mirrors step metrics to ``trackers``, each on its own thread (module docstring)."""

    def __init__(self, trackers: Sequence[Tracker], config: MirrorConfig | None = None) -> None:
        self._config = config or MirrorConfig()
        self._lanes = [_Lane(tracker, self._config) for tracker in trackers]

    def submit(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue one step's metrics for every tracker; returns at once."""
        if not self._lanes:
            return
        # Non-finite values are left out, as the run's own metrics leave them out.
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        for lane in self._lanes:
            lane.put((step, finite))

    def counters(self) -> dict[str, float]:
        """Per tracker: failed calls, steps dropped, steps still queued."""
        out: dict[str, float] = {}
        for lane in self._lanes:
            out.update(lane.counters())
        return out

    def close(self, outcome: Outcome, timeout_s: float | None = None) -> dict[str, float]:
        """Send what is queued within ``timeout_s``, end each tracker's run, and answer the
        final counters (what could not be sent is counted as dropped).

        A tracker whose last call failed gets no time: the end of the run does not wait
        for a server that is down.
        """
        wait = self._config.close_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        deadlines = [now + wait if lane.healthy else now for lane in self._lanes]
        for lane, deadline in zip(self._lanes, deadlines, strict=True):
            lane.close(outcome, deadline)
        for lane, deadline in zip(self._lanes, deadlines, strict=True):
            lane.join(deadline)
        return self.counters()


class MirroredSink:
    """A `RunSink` that reports to ``inner`` and mirrors each step's metrics to ``mirror``.

    Every step's metrics reach ``inner`` with the mirror's counters added; ``last_step``
    is the step reported last (where the host puts the final counters).
    """

    def __init__(self, inner: RunSink, mirror: TrackerMirror) -> None:
        self._inner = inner
        self.mirror = mirror
        self.last_step: int | None = None

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.last_step = step
        self._inner.on_step(step, {**metrics, **self.mirror.counters()})
        self.mirror.submit(step, metrics)

    def on_spans(self, spans: Sequence[Span]) -> None:
        self._inner.on_spans(spans)

    def on_trajectories(self, records: Sequence[TrajectoryRecord]) -> None:
        self._inner.on_trajectories(records)

    def on_checkpoint(self, record: CheckpointRecord) -> None:
        self._inner.on_checkpoint(record)


__all__ = ["MirrorConfig", "MirroredSink", "TrackerMirror"]
