"""Bodies of the adapter routes (/v1/adapters). The upload's body is a tar of the files."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.schemas._base import Timestamp


class AdapterRead(BaseModel):
    """An uploaded PEFT LoRA adapter, as read from its files at upload."""

    id: str = Field(description="What a run names: model.lora.init_from: adapter:<id>.")
    name: str
    rank: int = Field(description="The adapter's r: the run's model.lora.rank must equal it.")
    alpha: float = Field(description="The adapter's lora_alpha (the run rescales to its own).")
    targets: list[str] = Field(
        description="The projections it adapts, as model.lora.targets names them."
    )
    size_bytes: int
    created_at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class AdapterPage(BaseModel):
    items: list[AdapterRead]


__all__ = ["AdapterPage", "AdapterRead"]
