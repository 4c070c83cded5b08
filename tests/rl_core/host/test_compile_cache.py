"""A second process reads the programs the first compiled, instead of compiling them.

Each process is a subprocess: the cache is process-wide JAX configuration, which the
test process (and its other tests) must not inherit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# One jitted function of the model's kind of work; prints JAX's cache events for it.
PROGRAM = """
import json, sys
from pathlib import Path
import jax, jax.numpy as jnp
from rl_core.host.compile_cache import use_compilation_cache

events = []
jax.monitoring.register_event_listener(lambda name, **_: events.append(name))
folder = None if sys.argv[1] == "off" else Path(sys.argv[1])
print(json.dumps({"folder": str(use_compilation_cache(folder, min_compile_s=0))}))
step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
step(jnp.ones((16, 16)), jnp.ones((4, 16))).block_until_ready()
print(json.dumps({
    "hits": events.count("/jax/compilation_cache/cache_hits"),
    "misses": events.count("/jax/compilation_cache/cache_misses"),
}))
"""


def run(folder: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, folder],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path(__file__).parents[3],
    )
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_a_second_process_reads_what_the_first_compiled(tmp_path: Path) -> None:
    folder = tmp_path / "jax-cache"  # made by the first process
    first = run(str(folder))
    assert first["misses"] > 0 and first["hits"] == 0
    assert any(folder.iterdir())
    second = run(str(folder))
    assert second["hits"] == first["misses"] and second["misses"] == 0


def test_off_compiles_afresh_and_an_unusable_folder_is_not_fatal(tmp_path: Path) -> None:
    assert run("off") == {"hits": 0, "misses": 0}
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert run(str(blocker / "cache")) == {"hits": 0, "misses": 0}  # warned, compiled
