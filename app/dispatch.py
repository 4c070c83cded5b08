"""Handing runs to workers, by Celery task name, after the transaction commits.

The control plane never imports the worker: ``send_task`` needs only the name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from celery import Celery

TASK_RUN_JOB = "rlaas.run_job"
TASK_SERVE_CHECKPOINT = "rlaas.serve_checkpoint"  # worker/serving.py

log = logging.getLogger("rlaas.dispatch")


class Dispatcher(Protocol):
    def dispatch(self, run_id: str) -> None: ...

    def close(self) -> None: ...


class CeleryDispatcher:
    def __init__(self, broker_url: str, queue: str) -> None:
        if broker_url.startswith("sqla+"):
            # The server-less broker polls a table; see worker/celery_app.py.
            from kombu.transport import sqlalchemy as sqla_transport

            sqla_transport.Transport.polling_interval = 0.25
        self._celery = Celery("rlaas-api", broker=broker_url)
        self._celery.conf.broker_connection_retry_on_startup = True
        self._queue = queue

    def dispatch(self, run_id: str) -> None:
        self._celery.send_task(TASK_RUN_JOB, args=[run_id], queue=self._queue)

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
        self.served: list[tuple[dict[str, Any], str]] = []

    def dispatch(self, run_id: str) -> None:
        self.sent.append(run_id)

    def serve(self, order: dict[str, Any], queue: str) -> None:
        self.served.append((order, queue))

    def close(self) -> None:
        pass


async def dispatch_committed(dispatcher: Dispatcher, run_ids: Iterable[str]) -> None:
    """Send runs whose rows are already committed, off the event loop.

    Publishing is blocking network I/O (and retries when the broker is down), so it runs
    in a thread. A failure is logged, not raised: the run is durable and queued, and the
    caller's request has succeeded.
    """
    for run_id in run_ids:
        try:
            await asyncio.to_thread(dispatcher.dispatch, run_id)
        except Exception:
            log.exception("run %s is queued but could not be sent to the broker", run_id)
