"""The ``dataset`` environment's config: what the control plane checks at submit and the
worker's environment reads at reset (pure pydantic, no JAX).

::

    environment:
      name: dataset
      reward: math
      config:
        dataset: ds_...          # an uploaded dataset (POST /v1/datasets)
        prompt: question         # a field, or a template: "Solve: {question}"
        answer: answer           # the field put under reset info["answer"]
        system: "Think, then answer in \\boxed{}."
        split: {eval: 0.05}      # or {field: split}: rows whose field is "eval"
        shuffle: true
        epochs: 3                # null: cycle for as long as the run trains
        tools: [calculator]      # multi-turn with the built-in tools; [] single-turn

Keys the control plane and the worker write, never the tenant through the API:
``sha256`` (the content pinned at submit) and ``path`` (the worker's local copy).
A library user (``rlaas train``) gives ``path`` instead of ``dataset``.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DATASET_ID = re.compile(r"^ds_[0-9a-f]{32}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
TOOLS = ("calculator", "python")
# Set by the control plane or the worker; a tenant's spec through the API may not.
SERVER_KEYS = ("sha256", "path")


class Split(BaseModel):
    """Which rows are held out for evaluation: a share of them, or a field's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    field: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # With ``field``: rows whose field equals this are the eval split.
    value: str = "eval"

    @model_validator(mode="after")
    def _one_rule(self) -> Split:
        if (self.eval is None) == (self.field is None):
            raise ValueError("split takes one of 'eval' (a share, 0 to 1) or 'field'")
        return self


class DatasetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Annotated[str, Field(pattern=DATASET_ID.pattern)] | None = None
    sha256: Annotated[str, Field(pattern=SHA256.pattern)] | None = None
    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    prompt: Annotated[str, Field(min_length=1, max_length=20_000)] = "prompt"
    answer: Annotated[str, Field(min_length=1, max_length=200)] | None = "answer"
    system: Annotated[str, Field(max_length=20_000)] | None = None
    split: Split | None = None
    shuffle: bool = True
    seed: int = 0
    epochs: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    tools: tuple[Literal["calculator", "python"], ...] = Field(default=(), max_length=2)
    max_turns: Annotated[int, Field(ge=1, le=64)] = 4
    # The ``numeric`` verifier's tolerance (relative and absolute) for every row.
    tolerance: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _a_source(self) -> DatasetConfig:
        if self.dataset is None and self.path is None:
            raise ValueError("name the rows: 'dataset: ds_...' (an upload) or 'path' (a file)")
        return self

    def prompt_fields(self) -> list[str]:
        """The fields the prompt reads: those of a template's ``{...}``, else the one field."""
        if "{" not in self.prompt:
            return [self.prompt]
        try:
            parsed = list(string.Formatter().parse(self.prompt))
        except ValueError as exc:
            raise ValueError(f"prompt template: {exc}") from None
        names = [name for _, name, _, _ in parsed if name is not None]
        if any(not n or not n.isidentifier() for n in names):
            raise ValueError("prompt template fields must be names: 'Solve {question}'")
        return names

    def needed_fields(self) -> list[str]:
        fields = self.prompt_fields()
        if self.answer is not None:
            fields.append(self.answer)
        if self.split is not None and self.split.field is not None:
            fields.append(self.split.field)
        return sorted(set(fields))


__all__ = ["DATASET_ID", "SERVER_KEYS", "SHA256", "TOOLS", "DatasetConfig", "Split"]
