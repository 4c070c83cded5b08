"""Bodies of the environment routes (/v1/environments, /v1/env-callbacks) and the claim grant."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from app.schemas._base import Body, Timestamp

# What crosses to the worker and back from an environment: the wire contract's own models.
from rl_core.protocol.internal import EnvironmentGrant
from rl_core.protocol.webhook import CallbackAccepted

MIN_SECRET_CHARS = 16


class EnvironmentCreate(Body):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    url: str = Field(min_length=1, max_length=2000)
    # SecretStr: repr() and str() print '**********', so a logged body never shows it.
    secret: SecretStr = Field(min_length=MIN_SECRET_CHARS, max_length=1000)
    timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_concurrency: int = Field(default=16, ge=1, le=10_000)


class EnvironmentRead(BaseModel):
    """An environment as its owner sees it: everything but the secret."""

    id: str
    name: str
    url: str
    timeout_s: float
    max_concurrency: int
    created_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class EnvironmentPage(BaseModel):
    items: list[EnvironmentRead]


class CheckCall(BaseModel):
    """One request the check made: which, how it went, and what was wrong in words."""

    path: Literal["/reset", "/close"]
    ok: bool
    status_code: int | None
    duration_ms: float
    error: str | None


class CheckRead(BaseModel):
    ok: bool
    error: str | None = Field(description="The first problem found, in words; null when ok.")
    calls: list[CheckCall]


__all__ = [
    "MIN_SECRET_CHARS",
    "CallbackAccepted",
    "CheckCall",
    "CheckRead",
    "EnvironmentCreate",
    "EnvironmentGrant",
    "EnvironmentPage",
    "EnvironmentRead",
]
