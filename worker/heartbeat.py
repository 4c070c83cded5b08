"""A background thread that renews the run's lease and brings back requests.

The trainer runs on the main thread and checks ``cancel_requested`` between
steps; the heartbeat keeps the lease alive even while a long step computes.
"""

from __future__ import annotations

import logging
import threading

from worker.api_client import ControlPlane, ControlPlaneError, LeaseLost

log = logging.getLogger(__name__)


class Heartbeater:
    def __init__(self, api: ControlPlane, run_id: str, interval_s: float) -> None:
        self._api = api
        self._run_id = run_id
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.cancel_requested = threading.Event()
        self.lease_lost = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> Heartbeater:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval_s + 15)
        self._api.close()

    def should_stop(self) -> bool:
        return self.cancel_requested.is_set() or self.lease_lost.is_set()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                beat = self._api.heartbeat(self._run_id)
            except LeaseLost as exc:
                log.error("lease on %s lost: %s; stopping at the next step", self._run_id, exc)
                self.lease_lost.set()
                return
            except ControlPlaneError as exc:
                # The API is away; the lease may still be valid. Keep trying.
                log.warning("heartbeat for %s failed: %s", self._run_id, exc)
                continue
            if beat.cancel_requested and not self.cancel_requested.is_set():
                log.info("cancel requested for %s", self._run_id)
                self.cancel_requested.set()
