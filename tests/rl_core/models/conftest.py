"""Fixtures of the model tests: the loader tests' tiny random HF models, and SmolLM2."""

from __future__ import annotations

from tests.rl_core.pretrained.conftest import (  # noqa: F401  (fixtures used by name)
    TinyModel,
    smollm2,
    smollm2_path,
    tiny_models,
)
