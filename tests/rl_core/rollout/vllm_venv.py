"""The vLLM venv for tests that start a real server: built (minutes, once) when missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rl_core.rollout.vllm_server import vllm_python

REPO = Path(__file__).resolve().parents[3]


def ensure_vllm_venv() -> Path:
    """The vLLM interpreter (`vllm_python`), after scripts/vllm_venv.sh if it is absent."""
    python = vllm_python()
    if not python.exists():
        subprocess.run([str(REPO / "scripts" / "vllm_venv.sh")], check=True, timeout=1800)
    return python
