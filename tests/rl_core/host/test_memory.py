"""rl_core.host.memory: the malloc arena cap that long runs set at start-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_core.host import memory


def test_the_arena_cap_is_taken_by_glibc() -> None:
    # In a fresh interpreter, as an entry point would call it: before any thread starts.
    code = "from rl_core.host.memory import limit_malloc_arenas; print(limit_malloc_arenas(2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr


def test_without_a_c_library_to_tune_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.ctypes.util, "find_library", lambda _name: None)
    assert memory.limit_malloc_arenas() is False
