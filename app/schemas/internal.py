"""Bodies of the worker routes (/internal/...)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.schemas._base import Body, Timestamp
from app.schemas.environments import EnvironmentGrant
from app.schemas.results import INT32, CheckpointRef, InflightIn


class ClaimBody(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)


class ClaimRead(BaseModel):
    run_id: str
    spec: dict[str, Any]
    attempt: int
    lease_expires_at: Timestamp
    resume_step: int
    # The registered webhook environment the spec names (secret decrypted), or None.
    environment: EnvironmentGrant | None = None
    checkpoint: CheckpointRef | None = None  # the newest checkpoint: where to resume from


class HeartbeatBody(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)
    inflight: InflightIn | None = None  # what the run waits on now (GET /v1/runs/{id}/inflight)


class HeartbeatRead(BaseModel):
    cancel_requested: bool
    lease_expires_at: Timestamp
    profile_steps: int | None = None  # profile the next N steps; handed out once


class StatusBody(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    status: Literal["running", "succeeded", "failed", "cancelled"]
    error: str | None = Field(default=None, max_length=20_000)


class StatusRead(BaseModel):
    status: str


class PointIn(Body):
    step: int = Field(ge=0, le=INT32)
    name: str = Field(min_length=1, max_length=200)
    # Checked in pydantic-core, not a Python validator: a batch holds thousands of points.
    value: float = Field(allow_inf_nan=False)


class MetricsBody(Body):
    worker_id: str = Field(min_length=1, max_length=200)
    seq: int = Field(ge=0, le=2**63 - 1)
    points: list[PointIn] = Field(max_length=100_000)


class IngestRead(BaseModel):
    accepted: int
    duplicate: bool
