"""Prometheus metrics, a request id on every request, and JSON logs.

`ObservabilityMiddleware` is pure ASGI on purpose: Starlette's
BaseHTTPMiddleware buffers and re-wraps streaming responses (the SSE metric
stream), and runs the route in another task, where a context variable set by
the middleware would not reach the route's log lines.

Metrics are labelled by route *template* (``/v1/runs/{run_id}``), never by raw
path, so ids do not explode the series count; unmatched paths share one label.
Each app has its own registry (tests build many apps in one process). Under
``uvicorn --workers N`` every process serves its own numbers; scrape each, or
run one process per container as production deployments do.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Run
from app.services import run_states

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_VALID_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
_INGEST = re.compile(r"^/internal/runs/\{run_id\}/(metrics|spans|trajectories)$")
access_log = logging.getLogger("rlaas.access")


class Observability:
    """The metrics of one app, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rlaas_http_requests", "HTTP requests answered", ["method", "route", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "rlaas_http_request_duration_seconds", "Time to answer, by route template",
            ["method", "route"], registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.in_progress = Gauge("rlaas_http_requests_in_progress", "Requests being answered",
                                 registry=r)  # fmt: skip
        self.runs = Gauge(
            "rlaas_runs", "Runs by status (read at scrape time)", ["status"], registry=r
        )
        self.ingest_batches = Counter(
            "rlaas_ingest_batches", "Worker ingest batches by kind and answer status",
            ["kind", "status"], registry=r,
        )  # fmt: skip
        self.ingest_items = Counter(
            "rlaas_ingest_items", "Items (points, spans, trajectories) stored", ["kind"], registry=r
        )
        self.ingest_duplicates = Counter(
            "rlaas_ingest_duplicate_batches", "Retried batches skipped by seq", ["kind"], registry=r
        )

        self.sessions_lost = Counter(
            "rlaas_sessions_lost_calls",
            "Session calls told their session was lost to a worker restart (410)",
            registry=r,
        )

    def record_ingest(self, kind: str, accepted: int, duplicate: bool) -> None:
        """For ingest routes: what a batch stored (the middleware counts the batches)."""
        if duplicate:
            self.ingest_duplicates.labels(kind).inc()
        self.ingest_items.labels(kind).inc(accepted)

    async def render(self, sessions: async_sessionmaker[AsyncSession]) -> bytes:
        async with sessions() as session:
            rows = await session.execute(select(Run.status, func.count()).group_by(Run.status))
            counts: dict[str, int] = {status: int(n) for status, n in rows.all()}
        for status in run_states.ALL:
            self.runs.labels(status).set(counts.get(status, 0))
        return generate_latest(self.registry)


class ObservabilityMiddleware:
    def __init__(self, app: Any, observability: Observability) -> None:
        self.app = app
        self.obs = observability

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope) or uuid.uuid4().hex
        token = request_id.set(rid)
        status = 500  # if the app raises before answering, ServerErrorMiddleware sends a 500
        started = time.perf_counter()

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        self.obs.in_progress.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            self.obs.in_progress.dec()
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            method = scope["method"]
            self.obs.requests.labels(method, route, str(status)).inc()
            self.obs.latency.labels(method, route).observe(elapsed)
            ingest = _INGEST.match(route)
            if ingest:
                self.obs.ingest_batches.labels(ingest.group(1), str(status)).inc()
            access_log.info(
                "%s %s %d",
                method,
                route,
                status,
                extra={
                    "method": method,
                    "route": route,
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                    "tenant_id": scope.get("rlaas_tenant_id"),
                },
            )
            request_id.reset(token)


def _incoming_id(scope: Any) -> str | None:
    """A caller's X-Request-ID, if it is a sane token (it goes into logs and headers)."""
    for key, value in scope["headers"]:
        if key == b"x-request-id":
            text = value.decode("latin-1")
            return text if _VALID_ID.match(text) else None
    return None


_FIELDS = ("method", "route", "path", "status", "duration_ms", "tenant_id")


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the context that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, and known extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id.get(),
        }
        for name in _FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    """JSON lines on stderr for the ``rlaas`` loggers; once per process."""
    logger = logging.getLogger("rlaas")
    if any(getattr(h, "_rlaas_json", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    handler._rlaas_json = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
