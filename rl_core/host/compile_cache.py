"""XLA's compiled programs kept on disk, so a process does not compile what another did.

A run jits the engine's prefill and decode for every batch and length bucket and the
train step for every row shape: on a CPU worker that is seconds to tens of seconds per
run, paid again by every run of the same model and spec (bench B12 saw every run
recompile every shape). JAX's persistent compilation cache keys each program by its
computation, the compiler's version and flags, and the device, so a stale entry is
never used: a changed model or JAX version compiles afresh and adds its own entries.

Call ``use_compilation_cache`` in an entry point before the first jit, with the folder
the host's setting names (`folder_of`): ``RLAAS_JAX_CACHE_PATH`` for ``rlaas worker``,
``rlaas train`` and the tests; unset, ``~/.cache/rlaas/jax``; ``off``, no cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

log = logging.getLogger("rlaas.compile_cache")

# Programs that compile faster than this are not worth a disk write and read.
MIN_COMPILE_S = 0.2
# The folder's size limit; the least recently used programs go first. A limit is also what
# makes JAX lock the folder (filelock) around each read and write: without one, a process
# could read a program another is still writing (runs on one machine share the folder).
MAX_BYTES = 2 * 2**30


DEFAULT_FOLDER = "~/.cache/rlaas/jax"


def folder_of(setting: str | None) -> Path | None:
    """The folder a setting names: unset or empty is `DEFAULT_FOLDER`, ``off`` is None."""
    if setting == "off":
        return None
    return Path(setting or DEFAULT_FOLDER).expanduser()


def use_compilation_cache(
    folder: Path | None, *, min_compile_s: float = MIN_COMPILE_S
) -> Path | None:
    """Keep compiled programs in ``folder`` (created); None turns the cache off.

    Returns the folder in use, or None when it is off or cannot be made (a read-only
    home, say: the run goes on and compiles as before).
    """
    import jax

    # jax.config.update is untyped; this is its signature.
    set_option = cast(Callable[[str, Any], None], jax.config.update)
    if folder is None:
        set_option("jax_compilation_cache_dir", None)
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no compilation cache at %s (%s); compiling every program", folder, exc)
        return None
    set_option("jax_compilation_cache_dir", str(folder))
    set_option("jax_persistent_cache_min_compile_time_secs", min_compile_s)
    set_option("jax_persistent_cache_min_entry_size_bytes", 0)
    set_option("jax_compilation_cache_max_size", MAX_BYTES)
    return folder
