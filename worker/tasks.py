"""Celery tasks: as thin as a web view. Pass ids, not objects."""

from __future__ import annotations

import logging
from typing import Any

from worker.celery_app import TASK_RUN_JOB, app
from worker.hosting import HOSTING
from worker.job import execute_run
from worker.serving import TASK_SERVE_CHECKPOINT, serve_checkpoint
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@app.task(name=TASK_RUN_JOB)  # type: ignore[untyped-decorator]
def run_job(run_id: str) -> str:
    """Claim and execute one run; the outcome is reported to the control plane."""
    settings = WorkerSettings()
    with HOSTING.run(settings.runs_per_worker) as colocation:
        outcome = execute_run(run_id, settings, colocation=colocation)
    log.info("run %s finished: %s", run_id, outcome)
    return outcome


@app.task(name=TASK_SERVE_CHECKPOINT)  # type: ignore[untyped-decorator]
def serve_checkpoint_task(order: dict[str, Any]) -> str:
    """Serve a run's checkpoint until idle (worker/serving.py); sent by the API to the
    serve queue when a tenant first calls it."""
    with HOSTING.run(runs_per_worker=1):
        outcome = serve_checkpoint(order, WorkerSettings())
    log.info("run %s step %s served: %s", order.get("run_id"), order.get("step"), outcome)
    return outcome
