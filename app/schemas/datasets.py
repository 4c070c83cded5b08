"""Bodies of the dataset routes (/v1/datasets). The upload's body is the file itself."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Timestamp


class DatasetRead(BaseModel):
    """A dataset as its owner sees it: its size, rows, fields and content hash."""

    id: str
    name: str
    format: str = Field(
        description="The format uploaded: 'jsonl' or 'parquet' (stored as JSONL either way)."
    )
    sha256: str = Field(
        description="SHA-256 of the content stored: the JSONL file as uploaded, or a Parquet "
        "file's rows as JSONL (docs/datasets.md); a run pins it at submit."
    )
    size_bytes: int = Field(description="Bytes of the content stored (JSONL).")
    rows: int
    fields: list[str] = Field(description="The fields every row has, sorted.")
    created_at: Timestamp
    updated_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class DatasetPage(BaseModel):
    items: list[DatasetRead]


__all__ = ["DatasetPage", "DatasetRead"]
