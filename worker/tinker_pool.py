"""The LoRA models of one base and rank, as slots of one `MultiLoraTrainer`, and the
batching of their pending forward_backward calls into one program.

A call waits in `pending` while the trainer runs the previous batch; when it is free,
every waiting call of the same loss (and forward_only) goes in the next batch. So calls
of several models that arrive together share one forward and backward pass, and a call
alone runs at once, with no timer to wait on. Trainer work runs on threads, one at a
time (`lock`): a batch, an optim_step and a snapshot all read and replace the stacked
state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rl_core.errors import RlCoreError

T = TypeVar("T")

FIRST_SLOTS = 4  # slots a pool starts with; they double when all are taken


@dataclasses.dataclass
class _Call:
    slot: int
    data: list[Any]  # Datum
    loss_fn: str
    forward_only: bool
    done: asyncio.Future[Any]
    config: dict[str, Any] | None = None  # loss_fn_config: per-row values, so no batch key


class LoraPool:
    """Models of one base at one LoRA config. ``trainer`` is a `MultiLoraTrainer`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.lock = threading.Lock()
        self.pending: list[_Call] = []
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None  # held: the loop keeps tasks weakly
        self.batches = 0  # programs run, for tests and logs: fewer than calls when batched

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
        self.pending.append(_Call(slot, data, loss_fn, forward_only, done, config))
        if not self._draining:
            self._draining = True
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return await done

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # calls made ready in this same turn join the batch
            while self.pending:
                first = self.pending[0]
                key = (first.loss_fn, first.forward_only)
                batch = [c for c in self.pending if (c.loss_fn, c.forward_only) == key]
                self.pending = [c for c in self.pending if (c.loss_fn, c.forward_only) != key]
                await self._run_batch(batch)
        finally:
            self._draining = False

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
