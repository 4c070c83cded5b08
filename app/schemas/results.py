"""Bodies of what a run reports and how it is read back: spans, trajectories, artifacts.

The worker's bodies mirror ``rl_core.records`` (``to_json`` is the wire shape).
Integer bounds are the columns' bounds, so a value the database would refuse
is a 422 naming the field, never a 500.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from app.schemas._base import Body, Timestamp

INT32 = 2**31 - 1
INT64 = 2**63 - 1
Scalar = str | int | float | bool


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class WorkerBatch(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    seq: int = Field(ge=0, le=INT64)


class SpanIn(Body):
    name: str = Field(min_length=1, max_length=64)
    start_us: int = Field(ge=0, le=INT64)
    dur_us: int = Field(ge=0, le=INT64)
    track: str = Field(min_length=1, max_length=300)
    step: int = Field(ge=0, le=INT32)
    args: dict[str, Scalar] | None = None


class SpansBody(WorkerBatch):
    spans: list[SpanIn] = Field(max_length=100_000)


class SegmentIn(Body):
    text: str
    trained: bool


class TrajectoryIn(Body):
    episode_id: str = Field(min_length=1, max_length=300)
    step: int = Field(ge=0, le=INT32)
    policy_version: int = Field(ge=0, le=INT32)
    group: int = Field(ge=0, le=INT32)
    reward: float
    turns: int = Field(ge=0, le=INT32)
    end_state: Literal["done", "truncated", "timeout", "env_error", "cancelled"]
    end_reason: str | None = Field(default=None, max_length=2000)
    model_tokens: int = Field(ge=0, le=INT64)
    total_tokens: int = Field(ge=0, le=INT64)
    duration_s: float = Field(ge=0)
    segments: list[SegmentIn] = Field(max_length=10_000)
    sampling: dict[str, float | int]
    info: dict[str, Any] = Field(default_factory=dict)

    _reward_finite = field_validator("reward", "duration_s")(_finite)


class TrajectoriesBody(WorkerBatch):
    trajectories: list[TrajectoryIn] = Field(max_length=10_000)


class ArtifactBody(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    kind: Literal["checkpoint", "profile", "export"]
    step: int = Field(ge=0, le=INT32)
    uri: str = Field(min_length=1, max_length=4096)
    size_bytes: int | None = Field(default=None, ge=0, le=INT64)


class ArtifactStored(BaseModel):
    stored: bool


class CheckpointRef(BaseModel):
    """The newest checkpoint of a run, in the claim answer: where a new attempt resumes."""

    step: int
    uri: str
    size_bytes: int | None


class InflightEpisodeIn(Body):
    episode_id: str = Field(min_length=1, max_length=300)
    stage: str = Field(min_length=1, max_length=64)
    since_s: float = Field(ge=0)
    turn: int = Field(ge=0, le=INT32)


class InflightIn(Body):
    """``rl_core.records.InflightSnapshot`` as the heartbeat carries it."""

    step: int = Field(ge=0, le=INT32)
    trainer: str = Field(min_length=1, max_length=64)
    trainer_since_s: float = Field(ge=0)
    queue_depth: int = Field(ge=0, le=INT32)
    episodes: list[InflightEpisodeIn] = Field(max_length=10_000)


# --- public reads -----------------------------------------------------------------


class TrajectoryRead(BaseModel):
    """A stored ``TrajectoryRecord`` plus its ``id``."""

    id: int
    episode_id: str
    step: int
    policy_version: int
    group: int
    reward: float
    turns: int
    end_state: str
    end_reason: str | None
    model_tokens: int
    total_tokens: int
    duration_s: float
    segments: list[dict[str, Any]]
    sampling: dict[str, float | int]
    info: dict[str, Any]


class TrajectoryPage(BaseModel):
    items: list[TrajectoryRead]
    next_cursor: str | None


class CheckpointRead(BaseModel):
    step: int
    uri: str
    size_bytes: int | None
    created_at: Timestamp


class CheckpointPage(BaseModel):
    items: list[CheckpointRead]


class InflightRead(BaseModel):
    reported_at: Timestamp | None
    snapshot: dict[str, Any] | None


class ProfileCreate(Body):
    steps: int = Field(ge=1, le=100)


class ProfileRead(BaseModel):
    requested_steps: int


class TraceEvent(BaseModel):
    """A Chrome trace event: "X" (a complete span) or "M" (metadata: track names)."""

    name: str
    ph: Literal["X", "M"]
    pid: int
    tid: int
    cat: str | None = None
    ts: int | None = None
    dur: int | None = None
    args: dict[str, Any] = Field(default_factory=dict)


class TimelineRead(BaseModel):
    """Chrome trace-event JSON (object form): opens in Perfetto and chrome://tracing.

    ``otherData`` is the format's place for extras: ``truncated`` says the
    window held more spans than ``limit``; the next window starts at
    ``next_start_us`` (spans starting at that instant may repeat).
    """

    # The format's own field names.
    traceEvents: list[TraceEvent]
    displayTimeUnit: Literal["ms"] = "ms"
    otherData: dict[str, Any]
