"""Shared pieces of the request and response bodies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# A time in UTC (one without a zone, as SQLite keeps them, is read as UTC); the wire
# contract's own type, so the public reads and the worker's answers say times alike.
from rl_core.protocol.internal import Timestamp


class Body(BaseModel):
    """A request body: unknown fields are a 422 naming them, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


__all__ = ["Body", "Timestamp"]
