"""A background thread that ships a run's reports to the control plane, in order, exactly once.

The pipeline hands records to the sink from its event loop; the sink only
appends them here, so a slow or absent API never stalls an episode or the
trainer. This thread seals records into batches, numbers each batch with the
next sequence number of its kind, and sends the oldest batch first. A batch
that fails stays at the head of its queue under the same number and is sent
again after a backoff: the control plane stores each ``(run, kind, seq)``
once, so a batch whose answer was lost is not counted twice.

Metrics and checkpoint records are never dropped. Spans and trajectories are
bounded (the oldest are dropped past ``max_buffered`` and counted) because a
long outage must not exhaust the worker's memory with timeline detail.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from worker.api_client import ApiUnavailable, ControlPlaneError, LeaseLost

log = logging.getLogger(__name__)

# Sends one batch: (kind, seq, items) -> None; raises ApiUnavailable to retry later.
SendBatch = Callable[[str, int, list[dict[str, Any]]], None]


@dataclasses.dataclass
class _Lane:
    """The records of one kind: an open list, then sealed batches waiting their turn."""

    batch_items: int
    max_buffered: int | None  # None: never drop
    next_seq: int
    open: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sealed: collections.deque[tuple[int, list[dict[str, Any]]]] = dataclasses.field(
        default_factory=collections.deque
    )
    dropped: int = 0

    def buffered(self) -> int:
        return len(self.open) + sum(len(items) for _, items in self.sealed)

    def drop_oldest(self, count: int) -> None:
        # Whole sealed batches first (they are older), then the front of the open list.
        while count > 0 and self.sealed:
            _, items = self.sealed.popleft()
            self.dropped += len(items)
            count -= len(items)
        if count > 0:
            cut = min(count, len(self.open))
            del self.open[:cut]
            self.dropped += cut

    def seal(self) -> None:
        while self.open:
            items, self.open = self.open[: self.batch_items], self.open[self.batch_items :]
            self.sealed.append((self.next_seq, items))
            self.next_seq += 1


class Shipper:
    """Owns the lanes and the sender thread. ``add`` is cheap and thread-safe."""

    def __init__(
        self,
        send: SendBatch,
        *,
        first_seq: int,
        lanes: dict[str, tuple[int, int | None]],
        interval_s: float = 1.0,
        max_backoff_s: float = 10.0,
        on_refused: Callable[[ControlPlaneError], None] | None = None,
    ) -> None:
        """``lanes``: kind -> (items per batch, most items kept while the API is away).
        ``on_refused``: called (on this thread) once a batch is refused for good."""
        self._send = send
        self._on_refused = on_refused
        self._lanes = {
            kind: _Lane(batch_items=size, max_buffered=cap, next_seq=first_seq)
            for kind, (size, cap) in lanes.items()
        }
        self._interval_s = interval_s
        self._max_backoff_s = max_backoff_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._idle = threading.Condition(self._lock)
        self.fatal: ControlPlaneError | None = None  # LeaseLost etc.: stop shipping
        self._thread = threading.Thread(target=self._run, name="report-shipper", daemon=True)
        self._thread.start()

    def add(self, kind: str, items: list[dict[str, Any]], *, urgent: bool = False) -> None:
        with self._lock:
            lane = self._lanes[kind]
            lane.open.extend(items)
            if lane.max_buffered is not None:
                lane.drop_oldest(lane.buffered() - lane.max_buffered)
        if urgent:
            self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return sum(lane.buffered() for lane in self._lanes.values())

    def dropped(self, kind: str) -> int:
        with self._lock:
            return self._lanes[kind].dropped

    def flush(self, timeout_s: float) -> None:
        """Block until everything added so far is stored; raises ApiUnavailable after timeout_s."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._has_work_locked() and self.fatal is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiUnavailable(
                        f"{self._count_locked()} records still unsent after {timeout_s:.0f}s"
                    )
                self._wake.set()
                self._idle.wait(timeout=min(left, 0.5))
        if self.fatal is not None:
            raise self.fatal

    def close(self) -> None:
        """Stop the thread (after one last attempt); unsent records are given up."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def _has_work_locked(self) -> bool:
        return any(lane.open or lane.sealed for lane in self._lanes.values())

    def _count_locked(self) -> int:
        return sum(lane.buffered() for lane in self._lanes.values())

    def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.wait(timeout=max(backoff, self._interval_s))
            self._wake.clear()
            closing = self._closing.is_set()
            ok = self._send_all()
            backoff = 0.0 if ok else min(max(backoff * 2, 0.5), self._max_backoff_s)
            with self._idle:
                self._idle.notify_all()
            if closing or self.fatal is not None:
                return

    def _send_all(self) -> bool:
        """Send every sealed batch, oldest first per kind; False if the API is away."""
        with self._lock:
            for lane in self._lanes.values():
                lane.seal()
        for kind, lane in self._lanes.items():
            while True:
                with self._lock:
                    if not lane.sealed:
                        break
                    seq, items = lane.sealed[0]
                try:
                    self._send(kind, seq, items)
                except ApiUnavailable as exc:
                    log.warning("%s batch %d buffered (%s); retrying", kind, seq, exc)
                    return False
                except (LeaseLost, ControlPlaneError) as exc:
                    log.error("%s batch %d refused: %s; reporting stops", kind, seq, exc)
                    self.fatal = exc
                    if self._on_refused is not None:
                        self._on_refused(exc)
                    return False
                with self._lock:
                    # Unless add() dropped it meanwhile, the batch just stored is still the head.
                    if lane.sealed and lane.sealed[0][0] == seq:
                        lane.sealed.popleft()
        return True


__all__ = ["SendBatch", "Shipper"]
