"""Fixtures of the model tests: the checkpoint tests' tiny random HF models, and SmolLM2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.rl_core.pretrained.conftest import (  # noqa: F401  (fixtures used by name)
    TinyModel,
    smollm2,
    smollm2_path,
    tiny_models,
)


@pytest.fixture
def copy_model_dir(tiny_models: dict[str, TinyModel], tmp_path: Path) -> Path:  # noqa: F811
    """A private copy of the tiny Llama folder, for tests that break it."""
    target = tmp_path / "llama"
    shutil.copytree(tiny_models["llama"].path, target)
    return target
