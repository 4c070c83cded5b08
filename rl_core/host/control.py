"""`RunControl`: the thread-safe handle between a running pipeline and its host.

The pipeline runs in its own thread (event loop plus device thread); the host
(the worker's heartbeat thread, the CLI's signal handler, a test) talks to it
only through this object: it asks for a stop or a profile, and reads the
newest in-flight snapshot the pipeline published. Nothing here blocks.
"""

from __future__ import annotations

import threading

from rl_core.records import InflightSnapshot


class RunControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._profile_steps = 0
        self._inflight: InflightSnapshot | None = None

    # --- the host's side -----------------------------------------------------

    def request_stop(self) -> None:
        """Stop at the next step boundary (a final checkpoint is written)."""
        self._stop.set()

    def abort(self) -> None:
        """Stop at once, and write nothing more: no further step is trained or reported,
        no checkpoint is written. For a host that no longer owns the run (another worker
        holds it: the control plane refused this one's reports)."""
        self._abort.set()
        self._stop.set()

    def request_profile(self, steps: int) -> None:
        """Take a jax.profiler trace over the next ``steps`` train steps."""
        with self._lock:
            self._profile_steps = max(self._profile_steps, steps)

    def inflight(self) -> InflightSnapshot | None:
        with self._lock:
            return self._inflight

    # --- the pipeline's side -------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def take_profile_request(self) -> int:
        """Steps to profile that were asked for since the last call (0: none)."""
        with self._lock:
            steps, self._profile_steps = self._profile_steps, 0
            return steps

    def publish_inflight(self, snapshot: InflightSnapshot) -> None:
        with self._lock:
            self._inflight = snapshot


__all__ = ["RunControl"]
