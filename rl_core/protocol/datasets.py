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

A procedural source instead of rows of a file: a reasoning-gym task by name, its
tasks generated from ``seed``, scored by the task's own scorer unless
``environment.reward`` names a verifier (`rl_core.envs.procedural`)::

    environment:
      name: dataset
      config:
        dataset: reasoning_gym:basic_arithmetic
        dataset_config: {min_terms: 2, max_terms: 3}   # the task's own config
        size: null               # null: a fresh task for every training task; N: N in all
        split: {size: 200}       # tasks 0..199 held out for evaluation
"""

from __future__ import annotations

import difflib
import re
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rl_core.protocol.ecosystem import REASONING_GYM_DATASETS

DATASET_ID = re.compile(r"^ds_[0-9a-f]{32}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
TOOLS = ("calculator", "python")
# Set by the control plane or the worker; a tenant's spec through the API may not.
SERVER_KEYS = ("sha256", "path")
# ``dataset: reasoning_gym:<task>``: a procedural source, generated, not uploaded.
REASONING_GYM_PREFIX = "reasoning_gym:"
# The fields of a procedural source's rows: ``prompt`` and ``question`` are both the
# task's question (so the default prompt and a template of "{question}" both read it).
PROCEDURAL_FIELDS = ("answer", "prompt", "question")
# A sized procedural source's rows at most (its order is a permutation held in memory).
MAX_PROCEDURAL_SIZE = 1_000_000


def procedural_task(dataset: str | None) -> str | None:
    """The reasoning-gym task a ``dataset`` value names, or None for an upload's id."""
    if dataset is None or not dataset.startswith(REASONING_GYM_PREFIX):
        return None
    return dataset.removeprefix(REASONING_GYM_PREFIX)


class Split(BaseModel):
    """Which rows are held out for evaluation: a share of them, or a field's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    field: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    # A number of rows held out (seeded, as ``eval``); a procedural source's first ones.
    size: Annotated[int, Field(ge=1, le=MAX_PROCEDURAL_SIZE)] | None = None
    # With ``field``: rows whose field equals this are the eval split.
    value: str = "eval"

    @model_validator(mode="after")
    def _one_rule(self) -> Split:
        if sum(rule is not None for rule in (self.eval, self.field, self.size)) != 1:
            raise ValueError(
                "split takes one of 'eval' (a share, 0 to 1), 'size' (a number of rows) or 'field'"
            )
        return self


class DatasetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # ``ds_<id>`` (an upload) or ``reasoning_gym:<task>`` (a procedural source).
    dataset: Annotated[str, Field(max_length=200)] | None = None
    # A procedural source's own config (the reasoning-gym task's config class's keys).
    dataset_config: dict[str, Any] = Field(default_factory=dict)
    # A procedural source's rows, held-out ones included; None: unbounded, every training
    # task a fresh one.
    size: Annotated[int, Field(ge=2, le=MAX_PROCEDURAL_SIZE)] | None = None
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

    @field_validator("dataset")
    @classmethod
    def _known_source(cls, value: str | None) -> str | None:
        task = procedural_task(value)
        if value is None or DATASET_ID.match(value) or task in REASONING_GYM_DATASETS:
            return value
        if task is None:
            raise ValueError(
                f"{value!r} is neither an uploaded dataset's id (ds_ and 32 hex digits, from "
                f"POST /v1/datasets) nor a procedural source ({REASONING_GYM_PREFIX}<task>)"
            )
        near = difflib.get_close_matches(task, REASONING_GYM_DATASETS, n=3)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise ValueError(
            f"unknown reasoning-gym task {task!r}; {hint}the tasks are: "
            + ", ".join(REASONING_GYM_DATASETS)
        )

    @field_validator("dataset_config", "size", "path", "sha256")
    @classmethod
    def _for_its_source(cls, value: Any, info: ValidationInfo) -> Any:
        procedural = procedural_task(info.data.get("dataset")) is not None
        if info.field_name in ("dataset_config", "size") and value and not procedural:
            raise ValueError(
                f"{info.field_name} is for a procedural source (dataset: "
                f"{REASONING_GYM_PREFIX}<task>); an upload's rows are its own"
            )
        if info.field_name in ("path", "sha256") and value is not None and procedural:
            raise ValueError(
                f"a procedural source ({info.data['dataset']}) has no {info.field_name}"
            )
        if info.field_name == "dataset_config" and {"seed", "size"} & set(value):
            raise ValueError(
                "dataset_config must not set seed or size: write config.seed, config.size"
            )
        return value

    @field_validator("split")
    @classmethod
    def _split_for_its_source(cls, value: Split | None, info: ValidationInfo) -> Split | None:
        if value is None or procedural_task(info.data.get("dataset")) is None:
            return value
        if value.field is not None:
            raise ValueError(
                "a procedural source's rows have no split field; hold out 'size' rows "
                "(split: {size: 200}) or, with config.size, a share (split: {eval: 0.05})"
            )
        if value.eval is not None and info.data.get("size") is None:
            raise ValueError(
                "a share of an unbounded procedural source is not a number of rows; hold out "
                "'size' rows (split: {size: 200}), or give config.size"
            )
        size = info.data.get("size")
        if value.size is not None and size is not None and value.size >= size:
            raise ValueError(
                f"split.size holds out {value.size} of the source's {size} rows and leaves "
                "none to train on; hold out fewer, or raise config.size"
            )
        return value

    @model_validator(mode="after")
    def _a_source(self) -> DatasetConfig:
        if self.dataset is None and self.path is None:
            raise ValueError(
                "name the rows: 'dataset: ds_...' (an upload), 'dataset: reasoning_gym:<task>' "
                "(generated) or 'path' (a file)"
            )
        return self

    @property
    def task(self) -> str | None:
        """The reasoning-gym task of a procedural source, else None."""
        return procedural_task(self.dataset)

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


__all__ = [
    "DATASET_ID",
    "MAX_PROCEDURAL_SIZE",
    "PROCEDURAL_FIELDS",
    "REASONING_GYM_PREFIX",
    "SERVER_KEYS",
    "SHA256",
    "TOOLS",
    "DatasetConfig",
    "Split",
    "procedural_task",
]
