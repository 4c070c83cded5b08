"""Bodies of what a run reports and how it is read back: spans, trajectories, artifacts.

What the worker posts is ``rl_core.protocol.internal`` (re-exported here): the
same models on both sides of the wire, and ``rl_core.records``' ``to_json`` is
their wire shape. The reads below are the public API's, checked against the
protocol's records by tests/app/test_protocol_schemas.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Body, Timestamp
from rl_core.protocol.internal import (
    INT32,
    INT64,
    ArtifactBody,
    ArtifactStored,
    CheckpointRef,
    InflightEpisodeIn,
    InflightIn,
    SegmentIn,
    SpanIn,
    SpansBody,
    TrajectoriesBody,
    TrajectoryIn,
    WorkerBatch,
)

__all__ = [
    "INT32",
    "INT64",
    "ArtifactBody",
    "ArtifactStored",
    "CheckpointPage",
    "CheckpointRead",
    "CheckpointRef",
    "InflightEpisodeIn",
    "InflightIn",
    "InflightRead",
    "ProfileCreate",
    "ProfileRead",
    "SegmentIn",
    "SpanIn",
    "SpansBody",
    "TimelineRead",
    "TraceEvent",
    "TrajectoriesBody",
    "TrajectoryIn",
    "TrajectoryPage",
    "TrajectoryRead",
    "WorkerBatch",
]


# --- public reads -----------------------------------------------------------------


class TrajectoryRead(TrajectoryIn):
    """A stored ``TrajectoryRecord`` (the body the worker sent) plus its ``id``."""

    model_config = ConfigDict(extra="ignore")

    id: int


class TrajectoryPage(BaseModel):
    items: list[TrajectoryRead]
    next_cursor: str | None


class CheckpointRead(CheckpointRef):
    created_at: Timestamp


class CheckpointPage(BaseModel):
    items: list[CheckpointRead]


class ArtifactsDeleted(BaseModel):
    """A finished run's checkpoints and exports, deleted (``DELETE /v1/runs/{id}/artifacts``)."""

    run_id: str
    freed_bytes: int  # the run's storage use before, as its worker last measured it
    checkpoints: int  # checkpoints no longer listed


class LineageStep(BaseModel):
    """One step's update as the policy holds it: trained by ``attempt`` on the policy
    ``base_attempt`` left at ``base_step``; ``replaced``: attempts that trained this step
    too and died before a checkpoint kept their update (it is in no policy)."""

    step: int
    attempt: int
    base_step: int
    base_attempt: int
    optimizer_updates: int | None
    replaced: list[int]


class LineageRead(BaseModel):
    """The updates the run's newest checkpoint holds, step by step (docs/lifecycle.md,
    "Steps redone after a resume"). ``problems`` is empty when each step from 1 to
    ``policy_step`` is in it exactly once; otherwise it names the steps missing or doubled."""

    policy_step: int  # 0: no checkpoint yet
    policy_attempt: int | None
    steps: list[LineageStep]
    problems: list[str]


class InflightRead(BaseModel):
    reported_at: Timestamp | None
    snapshot: InflightIn | None  # as the worker's last heartbeat carried it


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
