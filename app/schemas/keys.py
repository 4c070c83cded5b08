"""Bodies of the API-key routes (/v1/keys)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Timestamp


class KeyRead(BaseModel):
    id: str
    prefix: str = Field(description="The part of the key after 'rlaas_', before the secret")
    created_at: Timestamp
    revoked_at: Timestamp | None

    model_config = ConfigDict(from_attributes=True)


class KeyCreated(KeyRead):
    key: str = Field(description="The whole key: shown this once, never stored")


class KeyPage(BaseModel):
    items: list[KeyRead]
