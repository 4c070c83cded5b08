"""Bodies of GET /v1/limits."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QuotasRead(BaseModel):
    runs_in_flight: int = Field(description="Queued, starting or running runs at once")
    requests_per_minute: int = Field(description="Requests to /v1 (a bucket: this many at once)")
    body_bytes: int = Field(description="Largest request body")


class UsageRead(BaseModel):
    runs_in_flight: int
    requests_available: int = Field(description="Requests that may be sent now without a 429")


class LimitsRead(BaseModel):
    quotas: QuotasRead
    usage: UsageRead
