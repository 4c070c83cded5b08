"""The device thread: every JAX call of a run (engine batches, train steps), one at a time.

Keeping device work off the event loop is what lets a thousand episodes stay
responsive while the trainer computes; keeping it in *one* thread makes the
engine and the trainer take turns on the accelerator instead of racing for it.

It is an `Executor`, so the rollout engine submits to it unchanged (anything
that arrives through `submit` is engine work); the pipeline's own calls go
through `run_trainer`. Each call is timed, which gives the engine's busy and
blocked time (blocked: a batch waited because the trainer held the device)
and one ``engine_batch`` span per engine call, annotated for jax.profiler.

In a worker whose runs share a base model (docs/shared-base.md) each run has its own
device thread, and every call also waits for its run's turn on the process's
`DeviceShare`; the engine's blocked time then includes the other runs' turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from rl_core.host.telemetry import SpanRecorder
from rl_core.pipeline.device_share import DeviceShare

P = ParamSpec("P")
T = TypeVar("T")


class DeviceThread(Executor):
    def __init__(
        self, recorder: SpanRecorder, share: tuple[DeviceShare, str] | None = None
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-device")
        self._recorder = recorder
        # (the process's share, this run's name in it): None when the run is alone.
        self._share = share
        if share is not None:
            share[0].join(share[1])
        self._lock = threading.Lock()
        self.step = 0  # the training step under way; labels engine spans
        self.engine_busy_s = 0.0
        self.engine_blocked_s = 0.0
        self.engine_calls = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Engine work: timed as an ``engine_batch`` span."""
        queued = time.perf_counter()

        def call() -> T:
            with self._turn():
                started = time.perf_counter()
                try:
                    with self._recorder.span(
                        "engine_batch", track="engine", step=self.step, annotate=True
                    ):
                        return fn(*args, **kwargs)
                finally:
                    done = time.perf_counter()
                    with self._lock:
                        self.engine_busy_s += done - started
                        self.engine_blocked_s += started - queued
                        self.engine_calls += 1

        return self._pool.submit(call)

    async def run_trainer(self, fn: Callable[..., T], *args: Any) -> T:
        """Pipeline work (train step, weight snapshot, checkpoint) on the device thread."""
        loop = asyncio.get_running_loop()

        def call() -> T:
            with self._turn():
                return fn(*args)

        return await loop.run_in_executor(self._pool, call)

    def _turn(self) -> contextlib.AbstractContextManager[None]:
        if self._share is None:
            return contextlib.nullcontext()
        share, owner = self._share
        return share.turn(owner)

    def engine_counters(self) -> tuple[float, float, int]:
        with self._lock:
            return self.engine_busy_s, self.engine_blocked_s, self.engine_calls

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
        if self._share is not None:
            self._share[0].leave(self._share[1])


__all__ = ["DeviceThread"]
