"""Fixtures of the model tests: the checkpoint tests' tiny random HF models, and SmolLM2."""

from __future__ import annotations

from tests.rl_core.checkpoints.conftest import (  # noqa: F401  (fixtures used by name)
    smollm2,
    smollm2_path,
    tiny_models,
)
