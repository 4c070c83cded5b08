"""The worker's metric sink: batches with sequence numbers, buffered while the API is away.

The control plane here is a small in-memory fake served through httpx's
MockTransport; the end-to-end tests cover the real one.
"""

from __future__ import annotations

import json

import httpx

from worker.api_client import ControlPlane
from worker.sinks import HttpMetricsSink


class FakeControlPlane:
    """Stores metric batches once per seq, like the real API; can be switched off."""

    def __init__(self) -> None:
        self.up = True
        self.batches: dict[int, list[dict[str, object]]] = {}
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content)
        duplicate = body["seq"] in self.batches
        self.batches.setdefault(body["seq"], body["points"])
        return httpx.Response(200, json={"accepted": len(body["points"]), "duplicate": duplicate})


def make_sink(fake: FakeControlPlane) -> HttpMetricsSink:
    api = ControlPlane(
        "http://api.test", "token", "w1", retry_seconds=0.0, transport=httpx.MockTransport(fake)
    )
    return HttpMetricsSink(api, "run_1", first_seq=100)


def test_each_step_is_one_batch_with_increasing_seq() -> None:
    fake = FakeControlPlane()
    sink = make_sink(fake)
    sink.on_step(1, {"reward/mean": 0.5, "loss": 1.0})
    sink.on_step(2, {"reward/mean": 0.7, "loss": 0.9})
    assert sorted(fake.batches) == [100, 101]
    assert {p["name"] for p in fake.batches[100]} == {"reward/mean", "loss"}
    assert all(p["step"] == 2 for p in fake.batches[101])


def test_batches_wait_while_api_is_down_and_none_is_lost_or_doubled() -> None:
    fake = FakeControlPlane()
    sink = make_sink(fake)
    sink.on_step(1, {"reward/mean": 0.1})
    fake.up = False
    sink.on_step(2, {"reward/mean": 0.2})
    sink.on_step(3, {"reward/mean": 0.3})
    assert sink.pending_batches == 2
    fake.up = True
    sink.flush()
    assert sink.pending_batches == 0
    steps = [p["step"] for seq in sorted(fake.batches) for p in fake.batches[seq]]
    assert steps == [1, 2, 3]


def test_big_steps_are_split_into_bounded_batches() -> None:
    fake = FakeControlPlane()
    api = ControlPlane("http://api.test", "t", "w1", transport=httpx.MockTransport(fake))
    sink = HttpMetricsSink(api, "run_1", batch_points=3)
    sink.on_step(1, {f"m{i}": float(i) for i in range(7)})
    assert [len(fake.batches[s]) for s in sorted(fake.batches)] == [3, 3, 1]


def test_non_finite_values_are_left_out_instead_of_breaking_the_batch() -> None:
    fake = FakeControlPlane()
    sink = make_sink(fake)
    sink.on_step(1, {"loss": float("nan"), "grad_norm": float("inf"), "reward/mean": 0.5})
    assert [p["name"] for p in fake.batches[100]] == ["reward/mean"]
