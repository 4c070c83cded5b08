"""Request and response bodies of the public and worker APIs."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from rl_core.spec import JobSpec


def _utc(value: datetime) -> datetime:
    # SQLite keeps no zone; every stored time is UTC, so say so in the response.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


Timestamp = Annotated[datetime, AfterValidator(_utc)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunCreate(_Body):
    spec: JobSpec
    name: str | None = Field(default=None, max_length=200)


class RunRead(BaseModel):
    id: str
    name: str | None
    status: str
    spec: dict[str, Any]
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


# --- worker API -------------------------------------------------------------


class ClaimBody(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)


class ClaimRead(BaseModel):
    run_id: str
    spec: dict[str, Any]
    attempt: int
    lease_expires_at: Timestamp
    resume_step: int


class HeartbeatBody(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)


class HeartbeatRead(BaseModel):
    cancel_requested: bool
    lease_expires_at: Timestamp


class StatusBody(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    status: Literal["running", "succeeded", "failed", "cancelled"]
    error: str | None = Field(default=None, max_length=20_000)


class StatusRead(BaseModel):
    status: str


class PointIn(_Body):
    step: int = Field(ge=0)
    name: str = Field(min_length=1, max_length=200)
    value: float

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class MetricsBody(_Body):
    worker_id: str = Field(min_length=1, max_length=200)
    seq: int = Field(ge=0)
    points: list[PointIn] = Field(max_length=100_000)


class IngestRead(BaseModel):
    accepted: int
    duplicate: bool
