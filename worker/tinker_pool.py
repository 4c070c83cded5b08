"""The LoRA models of one base and rank, as slots of one `MultiLoraTrainer`, and the
batching of their pending forward_backward calls into one program.

A call waits in `pending` while the trainer runs the previous batch; when it is free,
every waiting call of the same loss (and forward_only) goes in the next batch. So calls
of several models that arrive together share one forward and backward pass. Trainer work
runs on threads, one at a time (`lock`): a batch, an optim_step and a snapshot all read
and replace the stacked state.

By default a call alone runs at once. Loops that sample between their training calls
rarely have calls pending together (docs/tinker.md, T1), so the operator may set a
gathering window (``RLAAS_TINKER_GATHER_MS``). Before a batch runs, it waits for the calls
of the models that are keeping pace with the oldest pending call's model: those whose last
call ran in the same batch as that model's last call, or in a later one. It runs once they
are all pending, or once the window has passed since that oldest call arrived. So a call
waits at most the window, not at all when no other model keeps pace (a model's first call,
one that runs alone), and a model that stops (or is unloaded) is waited for once, for one
window, by each model that kept pace with it; no time constant says who is active.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from rl_core.errors import RlCoreError

T = TypeVar("T")

FIRST_SLOTS = 4  # slots a pool starts with; they double when all are taken
GATHER_SETTING = "RLAAS_TINKER_GATHER_MS"
MAX_GATHER_MS = 1000.0  # every call of an active pool may wait this long: more is a typo


def gather_window_s(environ: Mapping[str, str]) -> float:
    """The operator's gathering window (``RLAAS_TINKER_GATHER_MS``, milliseconds; unset or 0:
    none), in seconds."""
    raw = environ.get(GATHER_SETTING, "").strip()
    try:
        ms = float(raw) if raw else 0.0
    except ValueError:
        ms = -1.0
    if not 0.0 <= ms <= MAX_GATHER_MS:  # also refuses nan
        raise ValueError(
            f"{GATHER_SETTING} must be milliseconds from 0 (no gathering) to "
            f"{MAX_GATHER_MS:.0f}; got {raw!r}"
        )
    return ms / 1000.0


class Clock(Protocol):
    """The gathering window's time: `MonotonicClock`, or a test's hand-moved one."""

    def now(self) -> float: ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        """Return when ``event`` is set or ``timeout_s`` has passed, whichever is first."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)


@dataclasses.dataclass
class _Call:
    slot: int
    data: list[Any]  # Datum
    loss_fn: str
    forward_only: bool
    done: asyncio.Future[Any]
    arrived: float = 0.0  # on the pool's clock
    config: dict[str, Any] | None = None  # loss_fn_config: per-row values, so no batch key


class LoraPool:
    """Models of one base at one LoRA config. ``trainer`` is a `MultiLoraTrainer`;
    ``gather_s``: the gathering window (0: a batch never waits for more calls)."""

    def __init__(
        self,
        trainer: Any,
        *,
        gather_s: float = 0.0,
        clock: Clock | None = None,
    ) -> None:
        self.trainer = trainer
        self.lock = threading.Lock()
        self.pending: list[_Call] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None  # held: the loop keeps tasks weakly
        self.batches = 0  # programs run, for tests and logs: fewer than calls when batched
        self.gather_s = gather_s
        self._clock: Clock = clock or MonotonicClock()
        self._formed = 0  # batches formed (a batch split after a bad datum is still one)
        self._last_batch: dict[int, int] = {}  # slot -> the batch its newest call ran in
        self._arrival = asyncio.Event()  # set by every call that joins `pending`

    async def run(self, work: Callable[[Any], T]) -> T:
        """``work(trainer)`` on a thread, alone with the trainer."""

        def locked() -> T:
            with self.lock:
                return work(self.trainer)

        return await asyncio.to_thread(locked)

    async def forward_backward(
        self,
        slot: int,
        data: list[Any],
        loss_fn: str,
        forward_only: bool,
        config: dict[str, Any] | None = None,
    ) -> Any:  # SlotResult
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        now = 0.0
        if self.gather_s > 0:
            now = self._clock.now()
            self._arrival.set()  # a gathering batch looks again at who is missing
        self.pending.append(
            _Call(slot, data, loss_fn, forward_only, done, arrived=now, config=config)
        )
        if not self._draining:
            self._draining = True
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # calls made ready in this same turn join the batch
            while self.pending:
                await self._gather()
                first = self.pending[0]
                key = (first.loss_fn, first.forward_only)
                batch = [c for c in self.pending if (c.loss_fn, c.forward_only) == key]
                self.pending = [c for c in self.pending if (c.loss_fn, c.forward_only) != key]
                self._formed += 1
                for call in batch:
                    self._last_batch[call.slot] = self._formed
                await self._run_batch(batch)
        finally:
            self._draining = False

    async def _gather(self) -> None:
        """Wait for the calls of the models keeping pace with the oldest pending call's,
        until the window has passed since it arrived (it may have spent part of it
        behind the previous batch)."""
        if self.gather_s <= 0:
            return
        oldest = self.pending[0]
        since = self._last_batch.get(oldest.slot)
        if since is None:  # the model's first call: no pace to keep yet
            return
        pace = {slot for slot, n in self._last_batch.items() if n >= since}
        deadline = oldest.arrived + self.gather_s
        while True:
            missing = pace - {c.slot for c in self.pending}
            left = deadline - self._clock.now()
            if not missing or left <= 0:
                return
            self._arrival.clear()
            await self._clock.wait(self._arrival, left)

    async def _run_batch(self, batch: list[_Call]) -> None:
        from rl_core.training.multi_trainer import SlotCall

        loss_fn, forward_only = batch[0].loss_fn, batch[0].forward_only
        calls = [SlotCall(c.slot, c.data, c.config) for c in batch]
        self.batches += 1
        try:
            results = await self.run(
                lambda t: t.forward_backward(calls, loss_fn, forward_only=forward_only)
            )
        except RlCoreError as exc:
            if len(batch) == 1:
                _settle(batch[0].done, error=exc)
                return
            # One call's bad datum refused the batch: run each alone, so only it fails.
            for call in batch:
                await self._run_batch([call])
            return
        except Exception as exc:  # the worker's own failure: every caller sees it
            for call in batch:
                _settle(call.done, error=exc)
            return
        for call, result in zip(batch, results, strict=True):
            _settle(call.done, result=result)


def _settle(
    done: asyncio.Future[Any], *, result: Any = None, error: Exception | None = None
) -> None:
    """Answer a waiting call, unless its caller has gone (a cancelled request): setting a
    cancelled future would raise here and stop the batches of every other model."""
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
