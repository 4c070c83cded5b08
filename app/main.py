"""The FastAPI application: ``uvicorn app.main:app``, or ``create_app(settings)`` in tests.

Importing this module builds routes only; the engine, the Celery producer and
the lease reaper are made in the lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app import openapi
from app.api import (
    adapters,
    callbacks,
    dashboard,
    datasets,
    environments,
    health,
    ingest,
    init_from,
    internal,
    keys,
    limits,
    prometheus,
    results,
    runs,
    serving,
    sessions,
    stream,
    tinker,
    tinker_state,
    workers,
)
from app.api.body_limit import BodyLimitMiddleware
from app.api.deps import AppState
from app.crypto import SecretBox
from app.db.session import (
    DATABASE_DOWN,
    DATABASE_RETRY_AFTER_S,
    database_unreachable,
    make_engine,
    make_sessionmaker,
)
from app.dispatch import CeleryDispatcher, Dispatcher, ServeOrders, dispatch_committed
from app.errors import AppError
from app.live.stream import live_updates
from app.observability import Observability, ObservabilityMiddleware, configure_logging
from app.services import gateways
from app.services.callbacks import sweep as sweep_callbacks
from app.services.leases import (
    accelerators_of,
    fail_unclaimed_runs,
    reap_expired_leases,
    stranded_queued_runs,
)
from app.services.quotas import Limiter
from app.services.rate import SharedBuckets
from app.settings import Settings
from app.urlcheck import Allowlist

log = logging.getLogger("rlaas.api")


def create_app(
    settings: Settings | None = None, *, dispatcher: Dispatcher | None = None
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        conf = settings or Settings()
        # First, so a missing token fails start-up before anything is opened.
        worker_token = conf.resolved_worker_token()
        secrets = SecretBox(conf.resolved_secret_key(), old_keys=conf.resolved_old_secret_keys())
        allowlist = Allowlist.parse(conf.env_url_allowlist, embedded=conf.embedded)
        if conf.log_json:
            configure_logging()
        if worker_token is None and conf.worker_token:
            log.warning(
                "RLAAS_WORKER_TOKEN is set, but the shared worker token is off on this "
                "control plane: workers that send it are refused. Enrol each worker "
                "(`rlaas workers issue NAME`, its output as RLAAS_WORKER_CREDENTIAL), or keep "
                "the shared token on for now with RLAAS_ALLOW_SHARED_WORKER_TOKEN=1"
            )
        conf.prepare_data_dir()
        engine = make_engine(conf.resolved_database_url())
        sender = dispatcher or CeleryDispatcher(conf.resolved_broker_url())
        sessions = make_sessionmaker(engine)
        # On a database server every replica shares each tenant's request bucket, taken with
        # one statement on a small autocommit pool of its own; the embedded default is one
        # process, and SQLite would serialise a write per request.
        bucket_engine = (
            None
            if conf.embedded
            else make_engine(conf.resolved_database_url(), pool_size=4, autocommit=True)
        )
        buckets = None if bucket_engine is None else SharedBuckets(bucket_engine)
        tinker_tokens = (
            None
            if bucket_engine is None
            else SharedBuckets(bucket_engine, table="tinker_token_buckets")
        )
        app_state = AppState(
            settings=conf,
            sessions=sessions,
            dispatcher=sender,
            routes=conf.routes(),
            worker_token=worker_token,
            secrets=secrets,
            env_allowlist=allowlist,
            limits=Limiter(conf, buckets=buckets, tinker_tokens=tinker_tokens),
            # A dispatcher that can also ask for checkpoint servers (Celery's, the tests'
            # recorder) does; one that cannot leaves serving off.
            serve_orders=sender if isinstance(sender, ServeOrders) else None,
        )
        app_state.gateways = gateways.client_session()
        app.state.rlaas = app_state
        live = contextlib.AsyncExitStack()
        app.state.fanout = await live.enter_async_context(
            live_updates(
                app_state.sessions, conf.resolved_database_url(), resync_s=conf.stream_resync_s
            )
        )
        reaper = asyncio.create_task(_reap_forever(app_state), name="lease-reaper")
        # What exists now (modules, the app, the engine) lives as long as the process:
        # freezing it keeps the collector's full passes to what requests made. Unfrozen,
        # each pass walked every import-time object and stalled the loop ~100 ms about
        # once a second under ingest (the p99 of B8 in bench/).
        if conf.gc_freeze:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            if conf.gc_freeze:
                gc.unfreeze()
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await live.aclose()
            if (tinker_calls := getattr(app.state, "tinker", None)) is not None:
                await tinker_calls.close()  # Tinker calls in flight end with the process
            await app_state.gateways.close()
            sender.close()
            if bucket_engine is not None:
                await bucket_engine.dispose()
            await engine.dispose()

    app = FastAPI(title="rlaas", version="0.1.0", lifespan=lifespan)
    app.include_router(health.router)
    app.include_router(runs.router)
    app.include_router(sessions.router)
    app.include_router(serving.router)
    app.include_router(serving.internal_router)
    app.include_router(internal.claim_router)
    app.include_router(internal.router)
    app.include_router(workers.router)
    app.include_router(ingest.router)
    app.include_router(results.router)
    app.include_router(stream.router)
    app.include_router(environments.router)
    app.include_router(datasets.router)
    app.include_router(adapters.router)
    app.include_router(datasets.internal_router)
    app.include_router(init_from.internal_router)
    app.include_router(callbacks.router)
    app.include_router(callbacks.internal_router)
    app.include_router(limits.router)
    app.include_router(keys.router)
    app.include_router(tinker.router)
    app.include_router(tinker_state.router)
    app.include_router(tinker.internal_router)
    app.include_router(prometheus.router)
    # The dashboard last: its /static mount must not shadow any API route.
    app.include_router(dashboard.router)
    app.mount("/static", dashboard.static_files(), name="static")
    app.add_exception_handler(AppError, _render_app_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _render_validation_error)  # type: ignore[arg-type]
    for unreachable in DATABASE_DOWN:
        app.add_exception_handler(unreachable, _render_database_down)
    # Added last = outermost: the request id and metrics also cover 413s from the body limit.
    app.state.observability = Observability()
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(ObservabilityMiddleware, observability=app.state.observability)
    openapi.install(app)  # errors documented (and rendered) in the one shape
    return app


async def _reap_forever(app_state: AppState) -> None:
    while True:
        await asyncio.sleep(app_state.settings.reaper_interval_s)
        try:
            await reap_once(app_state)
        except Exception:
            log.exception("lease reaper pass failed; trying again next interval")


async def reap_once(app_state: AppState) -> list[str]:
    """One reaper pass; returns the runs re-queued after a lost lease.

    It also sweeps the environment callback rows nobody will read again, in its own
    transaction after the leases', so that a failing sweep cannot hold runs up.
    """
    settings = app_state.settings
    async with app_state.sessions() as session:
        requeued = await reap_expired_leases(session, policy=settings.requeue_policy())
        # Before the redispatch, so a run that waited out its limit is not sent again.
        unclaimed = await fail_unclaimed_runs(session, after_s=settings.max_queued_s)
        stranded = await stranded_queued_runs(session, after_s=settings.redispatch_after_s)
        # Each goes back to the queue of the accelerator it was admitted to.
        sends = await accelerators_of(session, [*requeued, *stranded])
        await session.commit()
    for run_id in unclaimed:
        log.warning("run %s waited %s s in the queue; failed", run_id, settings.max_queued_s)
    for run_id in requeued:
        log.warning("run %s lost its worker; dispatching it again", run_id)
    for run_id in stranded:
        log.warning("run %s is still queued; sending it to the broker again", run_id)
    await dispatch_committed(app_state.dispatcher, app_state.routes, sends)
    async with app_state.sessions() as session:
        await sweep_callbacks(session, retention_s=settings.callback_retention_s)
        await session.commit()
    return requeued


def _error_body(code: str, message: str, field: str | None, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field, **extra}}


async def _render_app_error(_request: Request, exc: AppError) -> JSONResponse:
    return JSONResponse(
        _error_body(exc.code, exc.message, exc.field, **exc.extra),
        status_code=exc.status_code,
        headers=exc.headers or None,
    )


async def _render_database_down(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After while the database is unreachable (restarting, failing over):
    callers retry (the SDK and workers do), and the pool reconnects on its own once it is
    back. Any other database error is a 500 in the same shape, without the driver's words."""
    if not database_unreachable(exc):
        log.exception("unhandled database error on %s %s", request.method, request.url.path)
        return JSONResponse(
            _error_body("internal", "internal error; the server logged it", None), status_code=500
        )
    log.warning("database unreachable on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        _error_body(
            "unavailable",
            f"the database is unreachable; retry in {DATABASE_RETRY_AFTER_S} s",
            None,
            retry_after_s=DATABASE_RETRY_AFTER_S,
        ),
        status_code=503,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
    )


async def _render_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422, in the one error shape, each problem naming its field path."""
    problems = [_problem(err) for err in exc.errors()]
    first = problems[0] if problems else {"field": None, "reason": "invalid request"}
    message = "; ".join(f"{p['field']}: {p['reason']}" for p in problems) or "invalid request"
    return JSONResponse(
        _error_body("invalid", message, first["field"], problems=problems), status_code=422
    )


def _problem(err: Any) -> dict[str, Any]:
    loc = [str(p) for p in err.get("loc", ())]
    # FastAPI's first element says where ("body", "query", "header", "path"); the rest is the
    # path inside it, which is what a caller needs: spec.algorithm.learning_rate.
    where, path = (loc[0], loc[1:]) if loc and loc[0] in _WHERE else ("body", loc)
    reason = str(err.get("msg", ""))
    if err.get("type") == "json_invalid":
        # loc[1] is the character offset, not a field.
        detail = (err.get("ctx") or {}).get("error", "")
        at = f" at character {path[0]}" if path else ""
        return {"field": "body", "in": where, "reason": f"body is not valid JSON{at}: {detail}"}
    if err.get("type") == "value_error" and (named := _NAMED_FIELD.match(reason)):
        # A rule across a model's fields (rl_core.spec: "resources.rollout_servers: ...")
        # is raised by the model, whose loc ends above the field: the message names it.
        path = [*path, *named.group(1).split(".")]
    return {"field": ".".join(path) or where, "in": where, "reason": reason}


_WHERE = ("body", "query", "header", "path")
_NAMED_FIELD = re.compile(r"Value error, ((?:[a-z_]+\.)+[a-z_]+): ")


app = create_app()
