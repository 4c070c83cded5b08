"""Shared pieces of the request and response bodies."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


def _utc(value: datetime) -> datetime:
    # SQLite keeps no zone; every stored time is UTC, so say so in the response.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


Timestamp = Annotated[datetime, AfterValidator(_utc)]


class Body(BaseModel):
    """A request body: unknown fields are a 422 naming them, never silently dropped."""

    model_config = ConfigDict(extra="forbid")
