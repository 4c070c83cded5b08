"""Runs of a benchmark as processes of their own, a few at a time, each pinned to its cores.

Used by the benchmarks that compare whole training runs (bench/learning_seeds.py,
bench/heldout_defaults.py): each run is a fresh process (its own JAX, its own compiles),
``parallel`` at a time; when they fit the cores each is pinned (``taskset``) to its
share, so two runs do not trade cores under the kernel's scheduler; with more runs than
cores the kernel shares them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def run_all(
    jobs: Sequence[tuple[K, list[str], Path]],  # (key, command, log file)
    *,
    parallel: int,
    cwd: Path,
    done: Callable[[K, int, float], None],  # (key, exit code, minutes), as each ends
) -> None:
    cores = os.cpu_count() or 1
    per = max(1, cores // parallel)
    pinned = 1 < parallel <= cores
    pending = list(jobs)
    running: dict[K, tuple[subprocess.Popen[bytes], int, float]] = {}
    while pending or running:
        while pending and len(running) < parallel:
            key, command, log = pending.pop(0)
            slot = min(set(range(parallel)) - {s for _, s, _ in running.values()})
            pin = ["taskset", "-c", f"{slot * per}-{slot * per + per - 1}"] if pinned else []
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [*pin, *command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT
                )
            running[key] = (process, slot, time.perf_counter())
        time.sleep(2)
        for key, (process, _, started) in list(running.items()):
            if process.poll() is None:
                continue
            del running[key]
            done(key, process.returncode, (time.perf_counter() - started) / 60)
