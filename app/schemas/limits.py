"""Bodies of GET /v1/limits."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QuotasRead(BaseModel):
    runs_in_flight: int = Field(description="Queued, starting or running runs at once")
    requests_per_minute: int = Field(description="Requests to /v1 (a bucket: this many at once)")
    body_bytes: int = Field(description="Largest request body")
    run_seconds: int | None = Field(
        description="Seconds the tenant's runs may hold workers in the rolling period "
        "(null: no budget)"
    )
    run_seconds_period_s: int = Field(description="The rolling period of run_seconds")
    train_steps: int | None = Field(description="Most train.steps one run may ask (null: no cap)")
    dataset_bytes: int = Field(description="Bytes all of the tenant's datasets may take")
    artifact_bytes: int = Field(
        description="Bytes the tenant's stored artifacts may take: its runs' kept checkpoints "
        "and exports, and its uploaded adapters"
    )


class UsageRead(BaseModel):
    runs_in_flight: int
    requests_available: int = Field(description="Requests that may be sent now without a 429")
    run_seconds: int = Field(description="Seconds the tenant's runs held workers in the period")
    dataset_bytes: int = Field(description="Bytes the tenant's datasets take")
    artifact_bytes: int = Field(
        description="Bytes the tenant's runs' kept checkpoints and exports (as of each run's "
        "newest checkpoint) and its uploaded adapters take"
    )


class LimitsRead(BaseModel):
    quotas: QuotasRead
    usage: UsageRead
