"""Celery tasks: as thin as a web view. Pass ids, not objects."""

from __future__ import annotations

import logging

from worker.celery_app import TASK_RUN_JOB, app
from worker.job import execute_run
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@app.task(name=TASK_RUN_JOB)  # type: ignore[untyped-decorator]
def run_job(run_id: str) -> str:
    """Claim and execute one run; the outcome is reported to the control plane."""
    outcome = execute_run(run_id, WorkerSettings())
    log.info("run %s finished: %s", run_id, outcome)
    return outcome
