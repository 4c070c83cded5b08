"""The worker's fetch of a run's pinned dataset content: hash checked, cached, never half."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from worker.datasets import DatasetUnavailable, HttpDatasets, with_local_dataset

CONTENT = b'{"q": "1+1", "a": "2"}\n' * 1000
SHA = hashlib.sha256(CONTENT).hexdigest()


def control_plane(body: bytes, calls: list[str], status: int = 200) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        assert request.headers["Authorization"] == "Bearer lease-token"
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "gone from the folder"}})
        return httpx.Response(200, content=body)

    return httpx.MockTransport(handle)


def test_fetches_checks_and_caches_by_hash(tmp_path: Path) -> None:
    calls: list[str] = []
    source = HttpDatasets(
        "http://api", "lease-token", tmp_path, transport=control_plane(CONTENT, calls)
    )
    path = source.fetch("run_1", SHA)
    assert path.read_bytes() == CONTENT and path.name == f"{SHA}.jsonl"
    assert source.fetch("run_1", SHA) == path  # the cache, named by the hash
    assert calls == [f"/internal/runs/run_1/datasets/{SHA}"]


def test_other_bytes_or_a_refusal_leave_nothing(tmp_path: Path) -> None:
    tampered = HttpDatasets(
        "http://api", "lease-token", tmp_path, transport=control_plane(CONTENT + b"x", [])
    )
    with pytest.raises(DatasetUnavailable, match="has SHA-256"):
        tampered.fetch("run_1", SHA)
    refused = HttpDatasets(
        "http://api", "lease-token", tmp_path, transport=control_plane(b"", [], status=404)
    )
    with pytest.raises(DatasetUnavailable, match="gone from the folder"):
        refused.fetch("run_1", SHA)
    assert list(tmp_path.iterdir()) == []


def test_the_spec_gets_the_local_path(tmp_path: Path) -> None:
    source = HttpDatasets(
        "http://api", "lease-token", tmp_path, transport=control_plane(CONTENT, [])
    )
    spec = {"environment": {"name": "dataset", "config": {"dataset": "ds_x", "sha256": SHA}}}
    local = with_local_dataset(spec, "run_1", source)
    assert local["environment"]["config"]["path"] == str(tmp_path / f"{SHA}.jsonl")
    assert "path" not in spec["environment"]["config"]  # the claim's own spec is untouched
    other = {"environment": {"name": "guess_number"}}
    assert with_local_dataset(other, "run_1", source) is other
    # A procedural source is generated on the worker: no content, no fetch.
    generated = {"environment": {"name": "dataset", "config": {"dataset": "reasoning_gym:gcd"}}}
    assert with_local_dataset(generated, "run_1", source) is generated
    with pytest.raises(DatasetUnavailable, match="no pinned content"):
        with_local_dataset({"environment": {"name": "dataset", "config": {}}}, "run_1", source)


def test_a_busy_or_dropped_control_plane_is_retried_until_the_deadline(tmp_path: Path) -> None:
    answers = iter([503, 429, "drop", 200])
    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        answer = next(answers)
        if answer == "drop":
            raise httpx.ConnectError("connection reset", request=request)
        assert isinstance(answer, int)
        return httpx.Response(answer, content=CONTENT if answer == 200 else b"")

    source = HttpDatasets(
        "http://api", "lease-token", tmp_path / "a", transport=httpx.MockTransport(flaky)
    )
    assert source.fetch("run_1", SHA).read_bytes() == CONTENT and len(calls) == 4
    busy = HttpDatasets(
        "http://api",
        "lease-token",
        tmp_path / "b",
        retry_seconds=1.0,
        transport=control_plane(b"", [], status=503),
    )
    with pytest.raises(DatasetUnavailable, match="gave up: HTTP 503"):
        busy.fetch("run_1", SHA)
    assert list((tmp_path / "b").iterdir()) == []
