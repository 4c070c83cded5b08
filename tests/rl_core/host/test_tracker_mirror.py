"""The tracker mirror with the fake tracker: a tracker down, failing, hung or refused
never holds back the run's sink, and what it missed is counted in the run's metrics.

No test times anything: a mirror that blocked the pipeline on a hung tracker would hang
here (the gate is only opened at the end), and a close that waited for a failing
tracker would wait out an hour of backoff.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from rl_core.host.sinks import MemorySink
from rl_core.host.trackers.fake import FakeTracker
from rl_core.host.trackers.mirror import MirrorConfig, MirroredSink, TrackerMirror

QUICK = MirrorConfig(backoff_s=0.001, backoff_max_s=0.01, close_timeout_s=30.0)
HOUR = 3600.0


def wait_for(condition: Callable[[], bool]) -> None:
    """Until the mirror's thread has done something (pytest's timeout bounds a hang)."""
    while not condition():
        threading.Event().wait(0.005)


def metrics(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "reward/mean": float(step)}


def test_every_step_reaches_the_tracker_in_order_and_its_run_is_ended() -> None:
    tracker = FakeTracker()
    inner = MemorySink()
    sink = MirroredSink(inner, TrackerMirror([tracker], QUICK))
    for step in range(1, 6):
        sink.on_step(step, metrics(step))
    final = sink.mirror.close("succeeded")

    assert tracker.steps == [(s, metrics(s)) for s in range(1, 6)]
    assert tracker.opened == 1 and tracker.outcome == "succeeded"
    assert final == {"tracker/fake/errors": 0, "tracker/fake/dropped": 0, "tracker/fake/pending": 0}
    # The run's own sink gets its metrics unchanged, plus the counters at that moment.
    for (step, got), want in zip(inner.steps, range(1, 6), strict=True):
        assert step == want and got["loss"] == metrics(want)["loss"]
        assert got["tracker/fake/errors"] == 0 and got["tracker/fake/dropped"] == 0


def test_failed_calls_are_counted_and_retried_until_they_succeed() -> None:
    tracker = FakeTracker(failures=3)  # opening fails three times, then works
    mirror = TrackerMirror([tracker], QUICK)
    mirror.submit(1, metrics(1))
    mirror.submit(2, {"loss": float("nan"), "kl": 0.5})
    final = mirror.close("failed")

    assert tracker.steps == [(1, metrics(1)), (2, {"kl": 0.5})]  # NaN left out, as the run does
    assert final["tracker/fake/errors"] == 3 and final["tracker/fake/dropped"] == 0
    assert tracker.outcome == "failed"


def test_a_tracker_that_stays_down_drops_its_batch_after_the_retries() -> None:
    tracker = FakeTracker(failures=10**9)
    inner = MemorySink()
    config = MirrorConfig(retries=2, backoff_s=0.001, backoff_max_s=0.001, close_timeout_s=HOUR)
    sink = MirroredSink(inner, TrackerMirror([tracker], config))
    sink.on_step(1, metrics(1))
    # The thread tries three times (one try, two retries) and gives the step up.
    wait_for(lambda: sink.mirror.counters()["tracker/fake/dropped"] == 1)
    sink.on_step(2, metrics(2))
    final = sink.mirror.close("succeeded")  # failing: not waited for, despite an hour allowed

    assert tracker.steps == [] and tracker.outcome is None  # never opened, never closed
    assert inner.steps[1][1]["tracker/fake/errors"] == 3
    assert inner.steps[1][1]["tracker/fake/dropped"] == 1
    assert final["tracker/fake/dropped"] == 2 and final["tracker/fake/pending"] == 0


def test_a_hung_tracker_never_blocks_the_sink_and_its_queue_stays_bounded() -> None:
    gate = threading.Event()
    tracker = FakeTracker(gate=gate)
    inner = MemorySink()
    config = MirrorConfig(max_pending=10, max_batch=4, close_timeout_s=0.05)
    sink = MirroredSink(inner, TrackerMirror([tracker], config))
    sink.on_step(0, metrics(0))
    assert tracker.entered.wait(30)  # step 0 is in the tracker's call, which hangs
    for step in range(1, 1001):  # the pipeline keeps reporting; nothing waits for the tracker
        sink.on_step(step, metrics(step))

    assert len(inner.steps) == 1001  # the run's own sink got every step
    counters = sink.mirror.counters()
    assert counters["tracker/fake/pending"] == 11  # 10 queued + the one in the hung call
    assert counters["tracker/fake/dropped"] == 990  # the oldest dropped, one at a time
    assert inner.steps[-1][1]["tracker/fake/dropped"] == 989

    final = sink.mirror.close("succeeded")  # gives up after 50 ms: the thread is left behind
    assert final == {
        "tracker/fake/errors": 0,
        "tracker/fake/dropped": 1001,
        "tracker/fake/pending": 0,
    }
    gate.set()  # let the left-behind thread finish


def test_the_queue_keeps_the_newest_steps() -> None:
    gate = threading.Event()
    tracker = FakeTracker(gate=gate)
    mirror = TrackerMirror([tracker], MirrorConfig(max_pending=3, max_batch=100))
    mirror.submit(0, metrics(0))
    assert tracker.entered.wait(30)
    for step in range(1, 8):
        mirror.submit(step, metrics(step))
    gate.set()
    final = mirror.close("succeeded")

    assert [step for step, _ in tracker.steps] == [0, 5, 6, 7]
    assert final["tracker/fake/dropped"] == 4


def test_a_permanent_refusal_is_not_retried_and_drops_everything_after_it() -> None:
    tracker = FakeTracker(failures=1, permanent=True)  # e.g. an address the allowlist refuses
    config = MirrorConfig(retries=5, backoff_s=HOUR, close_timeout_s=HOUR)
    mirror = TrackerMirror([tracker], config)
    mirror.submit(1, metrics(1))
    wait_for(lambda: mirror.counters()["tracker/fake/dropped"] == 1)
    for step in (2, 3):  # after the refusal: dropped as they come, never tried
        mirror.submit(step, metrics(step))
    wait_for(lambda: mirror.counters()["tracker/fake/dropped"] == 3)
    final = mirror.close("succeeded")

    assert final["tracker/fake/errors"] == 1  # one try, no backoff of an hour
    assert final["tracker/fake/dropped"] == 3 and tracker.steps == []


def test_a_worker_without_the_trackers_library_says_what_to_install(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = FakeTracker(missing_library=True)
    mirror = TrackerMirror([tracker], MirrorConfig(backoff_s=HOUR, close_timeout_s=HOUR))
    mirror.submit(1, metrics(1))
    mirror.submit(2, metrics(2))
    final = mirror.close("succeeded")

    assert final["tracker/fake/errors"] == 1 and final["tracker/fake/dropped"] == 2
    assert "pip install 'rlaas[worker,trackers]'" in caplog.text


def test_one_slow_tracker_does_not_hold_back_another() -> None:
    gate = threading.Event()
    slow, quick = FakeTracker("slow", gate=gate), FakeTracker("quick")
    mirror = TrackerMirror([slow, quick], MirrorConfig(close_timeout_s=0.05))
    for step in range(1, 4):
        mirror.submit(step, metrics(step))
    final = mirror.close("cancelled")
    gate.set()

    assert [s for s, _ in quick.steps] == [1, 2, 3] and quick.outcome == "cancelled"
    assert final["tracker/quick/dropped"] == 0 and final["tracker/slow/dropped"] == 3
