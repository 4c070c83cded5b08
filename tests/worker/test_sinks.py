"""The worker's run sink: numbered batches, shipped by a thread, buffered while the API is away.

The control plane here is a small in-memory fake behind httpx's MockTransport
(it stores each (kind, seq) once, like the real one); the end-to-end tests
cover the real API.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from rl_core.records import CheckpointRecord, Span, TextSegment, TrajectoryRecord
from worker.api_client import ApiUnavailable, ControlPlane, LeaseLost
from worker.sinks import HttpRunSink


class FakeControlPlane:
    def __init__(self) -> None:
        self.up = True
        self.lease_lost: int | None = None  # the status a lost lease is answered with
        self.batches: dict[tuple[str, int], list[dict[str, object]]] = {}
        self.updates: list[dict[str, object]] = []  # the metrics batches' `updates`
        self.artifacts: dict[tuple[str, int], dict[str, object]] = {}
        self.calls = 0
        self.lock = threading.Lock()
        self.hold: threading.Event | None = None  # set: every request waits for it
        self.arrived = threading.Event()  # a request has come in

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.arrived.set()
        if self.hold is not None:
            assert self.hold.wait(30), "the test never released the request"
        with self.lock:
            self.calls += 1
            if not self.up:
                raise httpx.ConnectError("connection refused", request=request)
            if self.lease_lost is not None:
                return httpx.Response(self.lease_lost, json={"error": {"message": "lease lost"}})
            body = json.loads(request.content)
            kind = request.url.path.rsplit("/", 1)[-1]
            if kind == "artifacts":
                self.artifacts[(body["kind"], body["step"])] = body
                return httpx.Response(200, json={"stored": True})
            key = {"metrics": "points", "spans": "spans", "trajectories": "trajectories"}[kind]
            duplicate = (kind, body["seq"]) in self.batches
            if not duplicate:
                self.updates += body.get("updates", [])
            self.batches.setdefault((kind, body["seq"]), body[key])
            return httpx.Response(200, json={"accepted": len(body[key]), "duplicate": duplicate})

    def items(self, kind: str) -> list[dict[str, object]]:
        return [p for (k, _), batch in sorted(self.batches.items()) if k == kind for p in batch]


@pytest.fixture
def fake() -> FakeControlPlane:
    return FakeControlPlane()


def make_sink(fake: FakeControlPlane, **kwargs: object) -> HttpRunSink:
    api = ControlPlane(
        "http://api.test", "token", "w1", retry_seconds=0.0, transport=httpx.MockTransport(fake)
    )
    return HttpRunSink(api, "run_1", first_seq=100, interval_s=0.05, **kwargs)  # type: ignore[arg-type]


def span(i: int) -> Span:
    return Span(name="env_step", start_us=i, dur_us=10, track="episode/e1", step=1)


def trajectory(step: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        episode_id=f"e{step}",
        step=step,
        policy_version=step - 1,
        group=0,
        reward=1.0,
        turns=2,
        end_state="done",
        end_reason=None,
        model_tokens=5,
        total_tokens=9,
        duration_s=0.1,
        segments=(TextSegment(text="hi", trained=False), TextSegment(text="42", trained=True)),
        sampling={"temperature": 1.0},
    )


def test_every_kind_reaches_the_api_in_numbered_batches(fake: FakeControlPlane) -> None:
    sink = make_sink(fake)
    sink.on_step(1, {"reward/mean": 0.5, "loss": 1.0})
    sink.on_spans([span(1), span(2)])
    sink.on_trajectories([trajectory(1)])
    sink.on_checkpoint(CheckpointRecord(step=1, uri="file:///tmp/ck/1", size_bytes=10))
    sink.flush(timeout_s=5)
    sink.close()
    assert {p["name"] for p in fake.items("metrics")} == {"reward/mean", "loss"}
    assert [s["start_us"] for s in fake.items("spans")] == [1, 2]
    assert fake.items("trajectories")[0]["segments"][1] == {"text": "42", "trained": True}
    assert fake.artifacts[("checkpoint", 1)]["uri"] == "file:///tmp/ck/1"
    assert all(seq >= 100 for _, seq in fake.batches)


def test_batches_wait_while_api_is_down_and_none_is_lost_or_doubled(
    fake: FakeControlPlane,
) -> None:
    sink = make_sink(fake)
    sink.on_step(1, {"reward/mean": 0.1})
    sink.flush(timeout_s=5)
    fake.up = False
    sink.on_step(2, {"reward/mean": 0.2})
    sink.on_step(3, {"reward/mean": 0.3})
    with pytest.raises(ApiUnavailable):
        sink.flush(timeout_s=0.3)
    assert sink.pending == 2
    fake.up = True
    sink.flush(timeout_s=15)
    sink.close()
    assert [p["step"] for p in fake.items("metrics")] == [1, 2, 3]


def test_on_step_never_waits_for_the_api(fake: FakeControlPlane) -> None:
    # The API takes a request and does not answer: the sender is stuck in it. Steps go
    # on being reported meanwhile (no clock: the request is held until released).
    fake.hold = threading.Event()
    sink = make_sink(fake)
    sink.on_step(0, {"loss": 1.0})
    assert fake.arrived.wait(10), "the sink never sent"
    for step in range(1, 51):
        sink.on_step(step, {"loss": 1.0})
    assert fake.calls == 0 and sink.pending == 51  # all queued behind the held request
    fake.hold.set()
    sink.flush(timeout_s=15)
    sink.close()
    assert [p["step"] for p in fake.items("metrics")] == list(range(51))


def test_big_steps_are_split_into_bounded_batches(fake: FakeControlPlane) -> None:
    sink = make_sink(fake, batch_points=3)
    sink.on_step(1, {f"m{i}": float(i) for i in range(7)})
    sink.flush(timeout_s=5)
    sink.close()
    sizes = [len(b) for (k, _), b in sorted(fake.batches.items()) if k == "metrics"]
    assert sizes == [3, 3, 1]


def test_spans_are_bounded_during_an_outage_and_the_drop_is_counted(
    fake: FakeControlPlane,
) -> None:
    fake.up = False
    sink = make_sink(fake, batch_spans=10, max_buffered_spans=25)
    for i in range(10):
        sink.on_spans([span(10 * i + j) for j in range(10)])
    fake.up = True
    sink.flush(timeout_s=15)
    sink.close()
    starts = [s["start_us"] for s in fake.items("spans")]
    assert len(starts) <= 25
    assert starts[-1] == 99  # the newest survive
    assert sink.dropped("spans") == 100 - len(starts)


def test_non_finite_values_are_left_out_instead_of_breaking_the_batch(
    fake: FakeControlPlane,
) -> None:
    sink = make_sink(fake)
    sink.on_step(1, {"loss": float("nan"), "grad_norm": float("inf"), "reward/mean": 0.5})
    sink.flush(timeout_s=5)
    sink.close()
    assert [p["name"] for p in fake.items("metrics")] == ["reward/mean"]


@pytest.mark.parametrize(
    "status",
    [403, 409],  # the lease token no longer holds the run; the run's state refuses the batch
)
def test_a_lost_lease_stops_shipping_and_flush_says_so(fake: FakeControlPlane, status: int) -> None:
    fake.lease_lost = status
    refusals: list[Exception] = []
    sink = make_sink(fake, on_refused=refusals.append)
    sink.on_step(1, {"loss": 1.0})
    with pytest.raises(LeaseLost):
        sink.flush(timeout_s=5)
    # The worker is told at once (it stops the run: worker.job), and once: nothing is sent
    # after the refusal.
    calls = fake.calls
    sink.on_step(2, {"loss": 1.0})
    sink.close()
    assert [type(e) for e in refusals] == [LeaseLost] and fake.calls == calls


def test_each_step_reports_its_update_linked_to_the_policy_it_was_applied_to(
    fake: FakeControlPlane,
) -> None:
    """Attempt 3 resumed from attempt 2's checkpoint of step 4: its first update is applied
    to that policy, each later one to the step before (docs/lifecycle.md, lineage)."""
    sink = make_sink(fake, attempt=3, resumed_from=(4, 2))
    sink.on_step(5, {"loss": 0.5, "optimizer_updates": 5.0})
    sink.on_step(6, {"loss": 0.4, "optimizer_updates": 6.0})
    sink.flush(timeout_s=5)
    sink.close()
    assert fake.updates == [
        {"step": 5, "attempt": 3, "base_step": 4, "base_attempt": 2, "optimizer_updates": 5},
        {"step": 6, "attempt": 3, "base_step": 5, "base_attempt": 3, "optimizer_updates": 6},
    ]
    # The points travel apart from the updates, as they did before.
    assert [(p["step"], p["name"]) for p in fake.items("metrics")] == [
        (5, "loss"),
        (5, "optimizer_updates"),
        (6, "loss"),
        (6, "optimizer_updates"),
    ]
