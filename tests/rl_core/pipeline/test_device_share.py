"""`DeviceShare`: the runs of one process take turns on the device by least device time
used (ties: first come); a newcomer starts level with the least-served run, one back from
a pause banks at most ``bank_s``, and one kept waiting by another's long call keeps all
it is due. Real threads; a hand-moved clock makes each call's length exact."""

from __future__ import annotations

import threading
import time

import pytest

from rl_core.pipeline.device_share import DeviceShare


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _wait_until_waiting(share: DeviceShare, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(share._waiting) < n:  # the calls are queued behind the holder
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.001)


def test_waiting_calls_run_in_order_of_their_runs_device_time() -> None:
    clock = Clock()
    share = DeviceShare(clock=clock)
    for run in ("a", "b", "c"):
        share.join(run)
    order: list[str] = []
    # a's long call holds the device while b, c and a again queue behind it.
    hold = share.turn("a")
    hold.__enter__()
    clock.t += 5.0  # a has used 5 s

    def call(run: str, length: float) -> None:
        with share.turn(run):
            order.append(run)
            clock.t += length

    threads = []
    for run, length in (("a", 1.0), ("c", 2.0), ("b", 1.0)):
        threads.append(threading.Thread(target=call, args=(run, length)))
        threads[-1].start()
        _wait_until_waiting(share, len(threads))
    hold.__exit__(None, None, None)
    for t in threads:
        t.join(10)
    # c and b (0 s used) before a (5 s); c asked first, and after it ran 2 s b (0 s) is
    # still behind it.
    assert order == ["c", "b", "a"]
    assert share.used() == {"a": 6.0, "b": 1.0, "c": 2.0}


def test_a_run_that_joins_late_starts_level_with_the_least_served() -> None:
    clock = Clock()
    share = DeviceShare(bank_s=100.0, clock=clock)  # no pause counts here
    share.join("a")
    share.join("b")
    for run, length in (("a", 30.0), ("b", 20.0)):
        with share.turn(run):
            clock.t += length
    share.join("c")
    assert share.used()["c"] == 20.0  # not 0: it cannot hold the device for 20 s in a row


def test_a_run_back_from_a_pause_banks_at_most_bank_s() -> None:
    clock = Clock()
    share = DeviceShare(bank_s=1.0, clock=clock)
    share.join("a")
    share.join("b")
    with share.turn("a"):  # b waits on its environments meanwhile, asking nothing
        clock.t += 10.0
    with share.turn("b"):  # 10 s since it last asked: it comes back 1 s behind a
        clock.t += 0.5
    assert share.used() == {"a": 10.0, "b": 9.5}


def test_a_run_kept_waiting_by_a_long_call_keeps_what_it_is_due() -> None:
    clock = Clock()
    share = DeviceShare(bank_s=1.0, clock=clock)
    share.join("a")
    share.join("b")
    with share.turn("b"):
        clock.t += 0.1
    hold = share.turn("a")  # a's 8 s train step ...
    hold.__enter__()

    def b_again() -> None:
        with share.turn("b"):
            clock.t += 0.1

    waiting = threading.Thread(target=b_again)
    waiting.start()  # ... with b asking at once, queued behind it
    _wait_until_waiting(share, 1)
    clock.t += 8.0
    hold.__exit__(None, None, None)
    waiting.join(10)
    # b asked 0 s after its last call ended: no pause, so it keeps its whole deficit.
    assert share.used() == pytest.approx({"a": 8.0, "b": 0.2})


def test_two_busy_runs_split_the_device_evenly() -> None:
    """Real time: a run of 20 ms calls and one of 5 ms calls, both always asking, hold
    the device for about as long each (fair by time, not by number of calls)."""
    share = DeviceShare()
    share.join("long")
    share.join("short")
    stop = threading.Event()

    def busy(run: str, seconds: float) -> None:
        while not stop.is_set():
            with share.turn(run):
                time.sleep(seconds)

    threads = [
        threading.Thread(target=busy, args=("long", 0.02)),
        threading.Thread(target=busy, args=("short", 0.005)),
    ]
    for t in threads:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(10)
    used = share.used()
    assert used["short"] / used["long"] == pytest.approx(1.0, abs=0.2)


def test_a_run_that_has_not_joined_is_refused() -> None:
    share = DeviceShare()
    with pytest.raises(KeyError, match="not joined"), share.turn("x"):
        pass


def test_a_share_of_capacity_two_runs_two_calls_at_once_and_queues_the_third() -> None:
    share = DeviceShare(capacity=2)
    for run in ("a", "b", "c"):
        share.join(run)
    first, second = share.turn("a"), share.turn("b")
    first.__enter__()
    second.__enter__()  # both hold the device: no wait
    ran = threading.Event()

    def third() -> None:
        with share.turn("c"):
            ran.set()

    t = threading.Thread(target=third)
    t.start()
    _wait_until_waiting(share, 1)
    assert not ran.is_set()
    first.__exit__(None, None, None)
    t.join(10)
    assert ran.is_set()
    second.__exit__(None, None, None)
