"""Bodies of the dataset routes (/v1/datasets). The upload's body is the file itself."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Timestamp


class DatasetRead(BaseModel):
    """A dataset as its owner sees it: its size, rows, fields and content hash."""

    id: str
    name: str
    format: str = Field(description="'jsonl' (Parquet is not taken yet: 415).")
    sha256: str = Field(description="SHA-256 of the file as uploaded; a run pins it at submit.")
    size_bytes: int
    rows: int
    fields: list[str] = Field(description="The fields every row has, sorted.")
    created_at: Timestamp
    updated_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class DatasetPage(BaseModel):
    items: list[DatasetRead]


__all__ = ["DatasetPage", "DatasetRead"]
