"""Celery tasks: as thin as a web view. Pass ids, not objects."""

from __future__ import annotations

import logging
from typing import Any

from worker.celery_app import TASK_RUN_JOB, app
from worker.job import execute_run
from worker.serving import TASK_SERVE_CHECKPOINT, serve_checkpoint
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@app.task(name=TASK_RUN_JOB)  # type: ignore[untyped-decorator]
def run_job(run_id: str) -> str:
    """Claim and execute one run; the outcome is reported to the control plane."""
    try:
        outcome = execute_run(run_id, WorkerSettings())
    finally:
        release_compiled_programs()
    log.info("run %s finished: %s", run_id, outcome)
    return outcome


@app.task(name=TASK_SERVE_CHECKPOINT)  # type: ignore[untyped-decorator]
def serve_checkpoint_task(order: dict[str, Any]) -> str:
    """Serve a run's checkpoint until idle (worker/serving.py); sent by the API to the
    serve queue when a tenant first calls it."""
    try:
        outcome = serve_checkpoint(order, WorkerSettings())
    finally:
        release_compiled_programs()
    log.info("run %s step %s served: %s", order.get("run_id"), order.get("step"), outcome)
    return outcome


def release_compiled_programs() -> None:
    """Drop the programs JAX compiled for the run that ended.

    A worker lives through many runs, and each run compiles its own shapes; kept, their
    executables pile up in the process (each holds memory mappings of its own: after two
    B12 runs a worker held ~20,000 and the third run's compile failed with ENOMEM once
    the kernel's 65,530-mapping limit was near). The next run of the same shapes reads
    them back from the persistent compilation cache (``RLAAS_JAX_CACHE_PATH``) instead
    of compiling. Imported here, not at the top: importing the Celery app starts no JAX.
    """
    import sys

    if "jax" not in sys.modules:
        return
    import jax

    from rl_core.rollout import steps

    steps.programs.cache_clear()
    jax.clear_caches()  # type: ignore[no-untyped-call]
