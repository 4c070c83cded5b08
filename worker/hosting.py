"""The runs one worker process hosts at once, and what they share.

By default a worker runs one run at a time (a solo pool). With
``RLAAS_RUNS_PER_WORKER`` above 1 it runs up to that many on a thread pool
(docs/shared-base.md), and they share one `rl_core.pipeline.colocation.Colocation`: LoRA
runs of one base hold its weights once, and every run's device work takes fair turns.

`Hosting.run` brackets each run: it hands the run the colocation (None when the worker
hosts one run at a time) and, when the last run in the process ends, drops the programs
JAX compiled for them (`release_compiled_programs`), never while another run still
uses them.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any


class Hosting:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._colocation: Any = None  # made by the first run that shares; imports JAX

    @contextlib.contextmanager
    def run(self, runs_per_worker: int) -> Iterator[Any]:
        """The run's `Colocation`, or None when this worker hosts one run at a time."""
        with self._lock:
            self._active += 1
            if runs_per_worker > 1 and self._colocation is None:
                from rl_core.pipeline.colocation import Colocation

                self._colocation = Colocation()
            colocation = self._colocation if runs_per_worker > 1 else None
        try:
            yield colocation
        finally:
            with self._lock:
                self._active -= 1
                last = self._active == 0
            if last:
                release_compiled_programs()


def release_compiled_programs() -> None:
    """Drop the programs JAX compiled for the runs that ended.

    A worker lives through many runs, and each run compiles its own shapes; kept, their
    executables pile up in the process (each holds memory mappings of its own: after two
    B12 runs a worker held ~20,000 and the third run's compile failed with ENOMEM once
    the kernel's 65,530-mapping limit was near). The next run of the same shapes reads
    them back from the persistent compilation cache (``RLAAS_JAX_CACHE_PATH``) instead
    of compiling. Imported here, not at the top: importing the Celery app starts no JAX.
    """
    if "jax" not in sys.modules:
        return
    import jax

    from rl_core.rollout import steps

    steps.programs.cache_clear()
    jax.clear_caches()  # type: ignore[no-untyped-call]


HOSTING = Hosting()  # the process's; the Celery tasks of this worker share it
