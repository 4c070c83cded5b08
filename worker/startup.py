"""What a worker says about itself once it is up: the sandbox wall it runs tenant code behind.

An operator reads it in two places: the worker's log (one line at start-up, an error
when this worker refuses tenant code, a warning when it runs it behind a weak wall), and
the control plane's ``/readyz``, where each worker's wall is listed from its last report
(sent here at start-up, and again with every claim: `worker.api_client.ControlPlane`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from rl_core.envs.walls import WallReport

log = logging.getLogger(__name__)


def sandbox_wall(settings: WorkerSettings) -> WallReport:
    """This worker's wall under its settings (the probes run once per process)."""
    from rl_core.envs.walls import assess

    return assess(settings.sandbox_walls())


def log_sandbox_wall(settings: WorkerSettings) -> WallReport:
    """The start-up line: INFO behind bubblewrap, ERROR when tenant code is refused,
    WARNING when it runs behind a weaker wall."""
    report = sandbox_wall(settings)
    level = {"runs": logging.INFO, "refused": logging.ERROR}.get(report.tenant_code)
    log.log(level or logging.WARNING, "worker %s: %s", settings.worker_id, report.message)
    return report


def announce(settings: WorkerSettings) -> threading.Thread:
    """Log the wall, then tell the control plane in the background (it may not be up yet:
    a failed report only logs, and the next claim carries the wall again)."""
    report = log_sandbox_wall(settings)

    def tell() -> None:
        from worker.api_client import ControlPlane, ControlPlaneError

        try:
            token = settings.resolved_worker_token()
            api = ControlPlane(settings.api_url, token, settings.worker_id, retry_seconds=30.0)
            try:
                api.report_worker(settings.queue, report)
            finally:
                api.close()
        except (ControlPlaneError, RuntimeError) as exc:
            log.warning("could not report this worker's sandbox wall yet: %s", exc)

    thread = threading.Thread(target=tell, name="rlaas-announce", daemon=True)
    thread.start()
    return thread
