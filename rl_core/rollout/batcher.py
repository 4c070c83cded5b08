"""Request batching for the built-in engine: many episodes, one device call.

Episodes run concurrently on the event loop and each asks for one
continuation at a time. The batcher waits a few milliseconds after the first
request so that the others, usually already on their way, join it, then runs
the whole batch in the device thread. This is the simple form of batching;
continuous batching (joining a running decode) comes later.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from rl_core.rollout.base import Completion, SamplingParams


@dataclasses.dataclass
class Request:
    prompt: Sequence[int]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    future: asyncio.Future[Completion] | None = None


class MicroBatcher:
    def __init__(
        self,
        run: Callable[[list[Request]], list[Completion]],
        executor: Executor,
        *,
        max_rows: int,
        window_s: float,
    ) -> None:
        self._run = run
        self._executor = executor
        self._max_rows = max_rows
        self._window_s = window_s
        self._queue: asyncio.Queue[Request] = asyncio.Queue()
        self.batches_run = 0
        self.rows_run = 0

    async def submit(self, requests: list[Request]) -> list[Completion]:
        loop = asyncio.get_running_loop()
        for request in requests:
            request.future = loop.create_future()
            self._queue.put_nowait(request)
        return list(await asyncio.gather(*(r.future for r in requests if r.future)))

    async def serve(self) -> None:
        """Run batches until cancelled; owned by `JaxEngine.serving`."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self._window_s)
            while len(batch) < self._max_rows and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            live = [r for r in batch if r.future is not None and not r.future.done()]
            if not live:  # every caller gave up (episode timeouts) while queued
                continue
            try:
                results = await loop.run_in_executor(self._executor, self._run, live)
            except asyncio.CancelledError:
                for request in live:
                    if request.future is not None:
                        request.future.cancel()
                raise
            except Exception as exc:
                for request in live:
                    if request.future is not None and not request.future.done():
                        request.future.set_exception(exc)
                continue
            self.batches_run += 1
            self.rows_run += len(live)
            for request, result in zip(live, results, strict=True):
                if request.future is not None and not request.future.done():
                    request.future.set_result(result)

    def cancel_queued(self) -> None:
        """Fail what is still queued, so no caller waits on a batcher that has stopped."""
        while not self._queue.empty():
            request = self._queue.get_nowait()
            if request.future is not None and not request.future.done():
                request.future.cancel()
