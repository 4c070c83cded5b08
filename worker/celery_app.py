"""The Celery application.

Celery objects are cheap to make (no connection is opened until a worker or a
producer needs one), so the app lives at module level where ``celery -A`` finds
it. Configuration follows Celery's advice for long jobs: prefetch one task,
acknowledge on receipt (recovery after a crash is the control plane's lease
reaper, not broker redelivery: a training run outlives any visibility
timeout), and a solo pool for workers that own an accelerator, because JAX
must not be forked once it has started.
"""

from __future__ import annotations

import logging

from celery import Celery
from celery.signals import after_setup_logger, worker_ready

from worker.settings import WorkerSettings

TASK_RUN_JOB = "rlaas.run_job"
# The HTTP clients' own loggers, which write a line per request at INFO (httpx: "HTTP
# Request: POST ..." for every heartbeat, report batch and, before aiohttp, environment
# call: ~9,000 lines a run).
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore", "aiohttp")


def make_celery(settings: WorkerSettings | None = None) -> Celery:
    settings = settings or WorkerSettings()
    broker = settings.resolved_broker_url()
    if broker.startswith("sqla+"):
        _tune_sqlalchemy_transport()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    celery = Celery("rlaas", broker=broker, include=["worker.tasks"])
    celery.conf.update(
        task_default_queue=settings.queue,
        worker_prefetch_multiplier=1,
        task_acks_late=False,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
    )
    return celery


def quiet_http_clients(loglevel: int = logging.INFO, **_: object) -> None:
    """Hold the HTTP clients' loggers at WARNING (their failures still show) unless the
    worker logs at DEBUG. Celery runs it once it has set up the worker's logging, with
    the level as a number."""
    if loglevel <= logging.DEBUG:
        return
    for name in HTTP_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


after_setup_logger.connect(quiet_http_clients)


def announce_worker(**_: object) -> None:
    """Once the worker is up: its sandbox wall, in its log and to the control plane
    (worker.startup). Imported here: the probes run only in a worker, not a producer."""
    from worker.startup import announce

    announce(WorkerSettings())


worker_ready.connect(announce_worker, weak=False)


def _tune_sqlalchemy_transport() -> None:
    # kombu's SQLAlchemy transport polls its table; the default second is a
    # visible delay for an interactive quickstart. It must be set on the class:
    # passing it through broker_transport_options crashes the worker.
    from kombu.transport import sqlalchemy as sqla_transport

    sqla_transport.Transport.polling_interval = 0.25


app = make_celery()
