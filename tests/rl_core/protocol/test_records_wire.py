"""rl_core.records (the pipeline's dataclasses) and rl_core.protocol.internal (the wire
models) describe one shape: each record's ``to_json`` is a valid body item with the same
fields, and ``from_json`` reads it back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel

from rl_core.protocol import internal as wire
from rl_core.records import (
    CheckpointRecord,
    InflightEpisode,
    InflightSnapshot,
    Span,
    TextSegment,
    TrajectoryRecord,
)

EPISODE = InflightEpisode(episode_id="r~a1-e0", stage="env_step", since_s=0.5, turn=2)
SNAPSHOT = InflightSnapshot(
    step=3, trainer="training", trainer_since_s=1.5, queue_depth=4, episodes=(EPISODE,)
)
SEGMENT = TextSegment(text="42", trained=True)
TRAJECTORY = TrajectoryRecord(
    episode_id="r~a1-e0",
    step=3,
    policy_version=2,
    group=1,
    reward=1.0,
    turns=2,
    end_state="done",
    end_reason="env_done",
    model_tokens=10,
    total_tokens=40,
    duration_s=0.25,
    segments=(TextSegment(text="Q: ", trained=False), SEGMENT),
    sampling={"temperature": 1.0, "top_k": 0},
    info={"answer": 42},
)
SPAN = Span(name="env_step", start_us=1, dur_us=2, track="episode/e", step=0, args={"turn": 1})
CHECKPOINT = CheckpointRecord(step=5, uri="file:///tmp/ckpt/5", size_bytes=1024)

PAIRS: list[tuple[Any, type[BaseModel]]] = [
    (EPISODE, wire.InflightEpisodeIn),
    (SNAPSHOT, wire.InflightIn),
    (SEGMENT, wire.SegmentIn),
    (TRAJECTORY, wire.TrajectoryIn),
    (SPAN, wire.SpanIn),
    (CHECKPOINT, wire.CheckpointRef),
]


@pytest.mark.parametrize(("record", "model"), PAIRS, ids=lambda x: type(x).__name__)
def test_each_record_is_its_wire_model(record: Any, model: type[BaseModel]) -> None:
    fields = {f.name for f in dataclasses.fields(record)}
    # Fields the control plane adds to what a worker sent, in its answers only: a
    # checkpoint's attempt comes from the lease that recorded it, not from the worker.
    added = {"attempt"} if model is wire.CheckpointRef else set()
    # And one a worker sends that no claim answers back: what the run stores now.
    sent_only = {"stored_bytes"} if model is wire.CheckpointRef else set()
    assert (fields - sent_only) | added == set(model.model_fields)
    parsed = model.model_validate(record.to_json())
    assert parsed.model_dump(mode="json", exclude_unset=True) == record.to_json()


def test_a_checkpoint_record_is_an_artifact_body_with_its_kind() -> None:
    record = dataclasses.replace(CHECKPOINT, stored_bytes=4096)
    body = wire.ArtifactBody.model_validate(
        {"worker_id": "w", "kind": "checkpoint", **record.to_json()}
    )
    assert set(wire.ArtifactBody.model_fields) == {"worker_id", "kind"} | {
        f.name for f in dataclasses.fields(CHECKPOINT)
    }
    assert (body.step, body.uri, body.size_bytes, body.stored_bytes) == (5, record.uri, 1024, 4096)


def test_from_json_reads_to_json_back() -> None:
    assert TrajectoryRecord.from_json({**TRAJECTORY.to_json(), "id": 7}) == TRAJECTORY
    assert InflightSnapshot.from_json(SNAPSHOT.to_json()) == SNAPSHOT


def test_every_batch_kind_carries_its_records() -> None:
    items = {"metrics": [{"step": 1, "name": "loss", "value": 0.5}]}
    items |= {"spans": [SPAN.to_json()], "trajectories": [TRAJECTORY.to_json()]}
    for kind, (_route, model, key) in wire.BATCHES.items():
        model.model_validate({"worker_id": "w", "seq": 0, key: items[kind]})
