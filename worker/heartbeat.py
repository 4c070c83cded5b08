"""A background thread that renews the run's lease and brings back requests.

Each beat carries the pipeline's newest in-flight snapshot (what the run is
waiting on) and brings back the cancel flag and profile requests, which it
passes to the pipeline through its `RunControl`. The lease stays alive even
while a long step computes.
"""

from __future__ import annotations

import logging
import threading

from rl_core.host.control import RunControl
from worker.api_client import ControlPlane, ControlPlaneError, LeaseLost

log = logging.getLogger(__name__)


class Heartbeater:
    def __init__(
        self,
        api: ControlPlane,
        run_id: str,
        interval_s: float,
        control: RunControl | None = None,
        lease_s: float | None = None,
    ) -> None:
        self._api = api
        self._run_id = run_id
        self._interval_s = interval_s
        # Each beat pushes the lease this far ahead: the worker's RLAAS_LEASE_SECONDS, as
        # its claim did (None: the control plane's default).
        self._lease_s = lease_s
        self.control = control or RunControl()
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

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                snapshot = self.control.inflight()
                beat = self._api.heartbeat(
                    self._run_id,
                    snapshot.to_json() if snapshot is not None else None,
                    lease_seconds=self._lease_s,
                )
            except LeaseLost as exc:
                # Another worker holds the run: stop at once, and write nothing (a checkpoint
                # of this attempt's policy would go where the new holder writes its own).
                log.error("lease on %s lost: %s; stopping now", self._run_id, exc)
                self.lease_lost.set()
                self.control.abort()
                return
            except ControlPlaneError as exc:
                # The API is away; the lease may still be valid. Keep trying.
                log.warning("heartbeat for %s failed: %s", self._run_id, exc)
                continue
            if beat.cancel_requested and not self.cancel_requested.is_set():
                log.info("cancel requested for %s", self._run_id)
                self.cancel_requested.set()
                self.control.request_stop()
            if beat.profile_steps:
                log.info("profile of %d steps requested for %s", beat.profile_steps, self._run_id)
                self.control.request_profile(beat.profile_steps)
