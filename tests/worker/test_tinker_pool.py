"""`LoraPool`'s batching, with a fake trainer (the real one is tests/worker/
test_tinker_server.py's): a caller that goes away mid-batch (its request cancelled)
costs the other models nothing, and the pool goes on batching."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rl_core.training.multi_trainer import SlotCall, SlotResult
from worker.tinker_pool import LoraPool, gather_window_s
from worker.tinker_server import TinkerWorker

pytestmark = pytest.mark.anyio

TOKENS = [1, 5, 6, 7, 8]
DATUM = {"tokens": TOKENS[:-1], "inputs": {"target_tokens": TOKENS[1:], "weights": [1.0] * 4}}


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


# --- the gathering window (RLAAS_TINKER_GATHER_MS) -----------------------------------------

WINDOW = 0.5  # seconds of the hand-moved clock (binary-exact, so sums compare equal)


class HandClock:
    """The pool's `Clock`, moved by the test: a wait ends when its event is set or when
    `advance` passes its deadline. ``waits`` is every timeout the pool waited with."""

    def __init__(self) -> None:
        self.t = 0.0
        self.waits: list[float] = []
        self.began = asyncio.Condition()  # notified as each wait begins
        self._timers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        self.waits.append(timeout_s)
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._timers.append((self.t + timeout_s, timer))
        woken = asyncio.ensure_future(event.wait())
        async with self.began:
            self.began.notify_all()
        try:
            await asyncio.wait({woken, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()
            self._timers = [(d, f) for d, f in self._timers if f is not timer]

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, timer in self._timers:
            if deadline <= self.t and not timer.done():
                timer.set_result(None)


class InstantTrainer:
    """Answers at once, recording each batch's slots."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def forward_backward(
        self, calls: list[SlotCall], loss_fn: str, *, forward_only: bool = False
    ) -> list[SlotResult]:
        self.batches.append([c.slot for c in calls])
        return [SlotResult([[float(c.slot)]], float(c.slot)) for c in calls]


def call(pool: LoraPool, slot: int) -> asyncio.Task[SlotResult]:
    return asyncio.create_task(pool.forward_backward(slot, ["d"], "cross_entropy", False))


async def waiting(clock: HandClock, count: int) -> float:
    """Until the pool has begun its ``count``-th wait on the clock; how long that one may
    last (the 10 s is a safety timeout only: no time passes before the pool waits)."""

    async def begun() -> None:
        async with clock.began:
            await clock.began.wait_for(lambda: len(clock.waits) >= count)

    await asyncio.wait_for(begun(), 10)
    return clock.waits[count - 1]


async def answered(*tasks: asyncio.Task[SlotResult]) -> list[float]:
    return [(await asyncio.wait_for(t, 10)).loss for t in tasks]


async def test_calls_arriving_within_the_window_run_as_one_batch() -> None:
    trainer, clock = InstantTrainer(), HandClock()
    pool = LoraPool(trainer, gather_s=WINDOW, clock=clock)
    # A model's first call has no pace to keep: it runs at once, on no timer.
    assert await answered(call(pool, 0)) == [0.0]
    assert await answered(call(pool, 1)) == [1.0]
    assert await answered(call(pool, 0), call(pool, 1)) == [0.0, 1.0]  # pending together
    assert trainer.batches == [[0], [1], [0, 1]] and clock.waits == []

    # Slot 1 again: slot 0 kept pace with it (same batch), so the batch waits for slot 0,
    # up to the window ...
    first = call(pool, 1)
    assert await waiting(clock, 1) == WINDOW
    clock.advance(0.25)
    second = call(pool, 0)  # ... which comes within it: one batch, at once
    assert await answered(first, second) == [1.0, 0.0]
    assert trainer.batches[-1] == [1, 0] and clock.waits == [WINDOW]
    assert pool.batches == 4


async def test_a_call_waits_at_most_the_window_for_models_that_do_not_come() -> None:
    trainer, clock = InstantTrainer(), HandClock()
    pool = LoraPool(trainer, gather_s=WINDOW, clock=clock)
    together = [call(pool, slot) for slot in (0, 1, 2)]  # pending at once: three active
    assert await answered(*together) == [0.0, 1.0, 2.0] and clock.waits == []

    lone = call(pool, 2)
    assert await waiting(clock, 1) == WINDOW
    clock.advance(0.25)
    other = call(pool, 0)  # one of the two it waits for comes; slot 1 does not
    assert await waiting(clock, 2) == 0.25  # the rest of the window, counted from the first
    assert not lone.done()
    clock.advance(0.25)
    assert await answered(lone, other) == [2.0, 0.0]
    assert trainer.batches[-1] == [2, 0] and clock.waits == [WINDOW, 0.25]


async def test_a_model_that_stops_is_waited_for_once() -> None:
    trainer, clock = InstantTrainer(), HandClock()
    pool = LoraPool(trainer, gather_s=WINDOW, clock=clock)
    await answered(call(pool, 0), call(pool, 1))
    # Slot 1's loop stops (or it is unloaded): slot 0's next call waits the window for it ...
    lone = call(pool, 0)
    assert await waiting(clock, 1) == WINDOW
    clock.advance(WINDOW)
    assert await answered(lone) == [0.0]
    # ... and then no more: slot 1 has not trained since slot 0 last did.
    assert await answered(call(pool, 0)) == [0.0]
    assert trainer.batches == [[0, 1], [0], [0]] and clock.waits == [WINDOW]


async def test_the_default_window_of_0_never_waits() -> None:
    trainer, clock = InstantTrainer(), HandClock()
    pool = LoraPool(trainer, clock=clock)
    assert pool.gather_s == 0.0
    await answered(call(pool, 0), call(pool, 1))  # both active
    assert await answered(call(pool, 1)) == [1.0]  # slot 0 is not waited for
    assert trainer.batches == [[0, 1], [1]] and clock.waits == []


async def test_the_window_on_the_real_clock_ends_a_lone_calls_wait() -> None:
    trainer = InstantTrainer()
    pool = LoraPool(trainer, gather_s=0.02)  # MonotonicClock
    await answered(call(pool, 0), call(pool, 1))
    assert await answered(call(pool, 1)) == [1.0]  # slot 0 never comes: the window ends it
    assert trainer.batches == [[0, 1], [1]]


def test_the_setting_is_milliseconds_and_a_bad_one_is_refused_naming_it() -> None:
    assert gather_window_s({}) == 0.0
    assert gather_window_s({"RLAAS_TINKER_GATHER_MS": "20"}) == 0.02
    for bad in ("-1", "fast", "1e9", "nan"):
        with pytest.raises(ValueError, match=f"RLAAS_TINKER_GATHER_MS must be .*'{bad}'"):
            gather_window_s({"RLAAS_TINKER_GATHER_MS": bad})


def test_a_worker_with_a_window_batches_a_call_that_comes_after_another() -> None:
    """The real trainer (builtin:tiny) behind `TinkerWorker`'s window: model b's call comes
    once a's is pending (not in the same turn, which batches with no window); with the
    window they run as one program, as without it they ran as two (3 batches, measured)."""
    fb = {"loss_fn": "cross_entropy", "data": [DATUM]}

    async def scenario() -> int:
        # 5 s: far longer than b's call takes to arrive, so the window never ends first.
        worker = TinkerWorker(("builtin:tiny",), gather_s=5.0)
        for model_id in ("a", "b"):
            await worker.create({"model_id": model_id, "base_model": "builtin:tiny", "rank": 2})
        pool = worker.models["a"].pool
        assert pool.gather_s == 5.0
        # Step 1: both at once (one batch); now both are active.
        await asyncio.gather(
            worker.forward_backward("a", {**fb, "seq_id": 1}),
            worker.forward_backward("b", {**fb, "seq_id": 1}),
        )
        first = asyncio.create_task(worker.forward_backward("a", {**fb, "seq_id": 2}))
        # Until a's call is in (its batch would start at the next turn): the pool has no
        # event for it, and a turn of the loop is no time.
        while not pool.pending:  # noqa: ASYNC110
            await asyncio.sleep(0)
        second = asyncio.create_task(worker.forward_backward("b", {**fb, "seq_id": 2}))
        await asyncio.wait_for(asyncio.gather(first, second), 60)
        return pool.batches

    assert asyncio.run(scenario()) == 2
