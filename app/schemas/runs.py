"""Bodies of the public run routes (/v1/runs...)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Body, Timestamp
from rl_core.spec import JobSpec


class RunCreate(Body):
    spec: JobSpec
    name: str | None = Field(default=None, max_length=200)


class RunRead(BaseModel):
    id: str
    name: str | None
    status: str
    spec: dict[str, Any]
    accelerator: str | None = Field(
        description="The accelerator the run was sent to: its spec's resources.accelerator, "
        "or the deployment's default then (null: submitted before runs named one)"
    )
    attempts: int
    current_step: int
    error: str | None
    cancel_requested: bool
    created_at: Timestamp
    updated_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None

    model_config = ConfigDict(from_attributes=True)


class RunPage(BaseModel):
    items: list[RunRead]
    next_cursor: str | None


class EventRead(BaseModel):
    id: int  # increasing; GET .../events?after=<id> returns the later ones
    from_status: str | None
    to_status: str
    reason: str | None
    created_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class EventPage(BaseModel):
    items: list[EventRead]


class PointRead(BaseModel):
    step: int
    name: str
    value: float


class MetricsRead(BaseModel):
    run_id: str
    points: list[PointRead]
