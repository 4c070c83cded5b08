"""Handing runs to workers, by Celery task name, after the transaction commits.

The control plane never imports the worker: ``send_task`` needs only the name. Each run
goes to the queue of its accelerator (`app.routing`); a `Dispatcher` is told the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from celery import Celery

from app.routing import Routes

TASK_RUN_JOB = "rlaas.run_job"
TASK_SERVE_CHECKPOINT = "rlaas.serve_checkpoint"  # worker/serving.py

log = logging.getLogger("rlaas.dispatch")


class Dispatcher(Protocol):
    def dispatch(self, run_id: str, queue: str) -> None: ...

    def close(self) -> None: ...


class CeleryDispatcher:
    def __init__(self, broker_url: str) -> None:
        if broker_url.startswith("sqla+"):
            # The server-less broker polls a table; see worker/celery_app.py.
            from kombu.transport import sqlalchemy as sqla_transport

            sqla_transport.Transport.polling_interval = 0.25
        self._celery = Celery("rlaas-api", broker=broker_url)
        self._celery.conf.broker_connection_retry_on_startup = True

    def dispatch(self, run_id: str, queue: str) -> None:
        self._celery.send_task(TASK_RUN_JOB, args=[run_id], queue=queue)

    def serve(self, order: dict[str, Any], queue: str) -> None:
        """Ask a worker of ``queue`` to serve a checkpoint (`app.services.serving`)."""
        self._celery.send_task(TASK_SERVE_CHECKPOINT, args=[order], queue=queue)

    def close(self) -> None:
        self._celery.close()


@runtime_checkable
class ServeOrders(Protocol):
    def serve(self, order: dict[str, Any], queue: str) -> None: ...


class RecordingDispatcher:
    """The fake: remembers what would have been sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.sent_to: list[tuple[str, str]] = []  # (run id, queue)
        self.served: list[tuple[dict[str, Any], str]] = []

    def dispatch(self, run_id: str, queue: str) -> None:
        self.sent.append(run_id)
        self.sent_to.append((run_id, queue))

    def serve(self, order: dict[str, Any], queue: str) -> None:
        self.served.append((order, queue))

    def close(self) -> None:
        pass


async def dispatch_committed(
    dispatcher: Dispatcher, routes: Routes, runs: Iterable[tuple[str, str | None]]
) -> None:
    """Send runs whose rows are already committed, each (run id, accelerator) to its
    accelerator's queue, off the event loop.

    Publishing is blocking network I/O (and retries when the broker is down), so it runs
    in a thread. A failure is logged, not raised: the run is durable and queued, and the
    caller's request has succeeded (the reaper sends it again). A run whose accelerator
    the deployment stopped offering is not sent: it waits, logged, until RLAAS_QUEUES
    offers it again or RLAAS_MAX_QUEUED_S fails it.
    """
    for run_id, accelerator in runs:
        queue = routes.queue_of(accelerator)
        if queue is None:
            log.error(
                "run %s asks for %s, which RLAAS_QUEUES no longer offers (%s); not sent",
                run_id,
                accelerator,
                ", ".join(routes.accelerators),
            )
            continue
        try:
            await asyncio.to_thread(dispatcher.dispatch, run_id, queue)
        except Exception:
            log.exception("run %s is queued but could not be sent to the broker", run_id)
