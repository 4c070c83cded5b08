"""`LoraPool`'s batching, with a fake trainer (the real one is tests/worker/
test_tinker_server.py's): a caller that goes away mid-batch (its request cancelled)
costs the other models nothing, and the pool goes on batching."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rl_core.training.multi_trainer import SlotCall, SlotResult
from worker.tinker_pool import LoraPool

pytestmark = pytest.mark.anyio


class SlowTrainer:
    """Answers each call with its slot's number after ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[list[int]] = []

    def forward_backward(
        self, calls: list[SlotCall], loss_fn: str, *, forward_only: bool = False
    ) -> list[SlotResult]:
        self.batches.append([c.slot for c in calls])
        assert self.release.wait(10)
        return [SlotResult([[float(c.slot)]], float(c.slot)) for c in calls]


async def test_a_caller_cancelled_mid_batch_leaves_the_others_their_answers() -> None:
    trainer = SlowTrainer()
    pool = LoraPool(trainer)
    first = asyncio.create_task(pool.forward_backward(0, ["d"], "cross_entropy", False))
    await asyncio.sleep(0.05)  # the first batch runs: slot 0 alone
    gone = asyncio.create_task(pool.forward_backward(1, ["d"], "cross_entropy", False))
    kept = asyncio.create_task(pool.forward_backward(2, ["d"], "cross_entropy", False))
    await asyncio.sleep(0.05)
    gone.cancel()  # its client went away while it waited for the next batch
    trainer.release.set()
    assert (await asyncio.wait_for(first, 10)).loss == 0.0
    # (Before _settle, answering the cancelled call raised in the pool's drain task, and
    # this one was never answered.)
    assert (await asyncio.wait_for(kept, 10)).loss == 2.0
    assert trainer.batches == [[0], [1, 2]]  # slots 1 and 2 were batched together
    # The pool still batches.
    again = await asyncio.wait_for(pool.forward_backward(3, ["d"], "cross_entropy", False), 10)
    assert again.loss == 3.0 and trainer.batches[-1] == [3]
