"""Runs as their owner sees them: submit, read, list, cancel."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import MetricPoint, Run, RunEvent, utcnow
from app.errors import BadRequest, Conflict, NotFound, Unprocessable
from app.routing import Routes
from app.schemas import RunCreate
from app.services import datasets, environments, init_from, run_states
from rl_core.spec import JobSpec, shared_model_source_problem


def request_hash(body: RunCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def create_run(
    session: AsyncSession,
    tenant_id: str,
    body: RunCreate,
    idempotency_key: str | None,
    *,
    routes: Routes,
    admit: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Run, bool]:
    """Store a new run; returns (run, created). A replayed key returns the first run.

    ``admit`` (quotas) runs only for a new run: a replay answers even at the limit.
    ``routes``: what the deployment offers; the run's ``resources`` must fit one of its
    accelerators (422 naming the field if not), which is kept on the row.
    """
    digest = request_hash(body)
    if idempotency_key is not None:
        existing = await _replayed(session, tenant_id, idempotency_key, digest)
        if existing is not None:
            return existing, False
    await environments.require_environment(session, tenant_id, body.spec.environment)
    _require_shared_safe(body.spec)
    accelerator = routes.admit(body.spec.resources)
    _require_storable(body.name, "name")
    _require_storable(body.spec.name, "spec.name")
    if admit is not None:
        await admit()
    # After the admission, which locks the tenant's row: an upload replacing this content
    # waits for the commit, so the content pinned here is not removed under the run.
    spec = await datasets.pin(session, tenant_id, body.spec.model_dump(mode="json"))
    spec = await init_from.pin(session, tenant_id, spec)  # the adapter's step, pinned
    now = utcnow()
    run = Run(
        id=f"run_{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        name=body.name or body.spec.name,
        status=run_states.QUEUED,
        spec=spec,
        accelerator=accelerator,
        idempotency_key=idempotency_key,
        request_hash=digest,
        attempts=0,
        cancel_requested=False,
        current_step=0,
        created_at=now,
        updated_at=now,
        queued_at=now,
    )
    try:
        # A savepoint: two requests racing with one key both pass the lookup above;
        # the loser's insert fails on the unique key and it answers with the winner's run.
        async with session.begin_nested():
            session.add(run)
            run_states.record_creation(session, run)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = await _replayed(session, tenant_id, idempotency_key, digest)
        if existing is None:
            raise
        return existing, False
    return run, True


async def _replayed(
    session: AsyncSession, tenant_id: str, idempotency_key: str, digest: str
) -> Run | None:
    """The run first made with this key, if any; Conflict if that request had another body."""
    existing = await session.scalar(
        select(Run).where(Run.tenant_id == tenant_id, Run.idempotency_key == idempotency_key)
    )
    if existing is not None and existing.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was used with a different body; use a new key",
            field="Idempotency-Key",
        )
    return existing


async def get_run(session: AsyncSession, tenant_id: str, run_id: str) -> Run:
    run = await session.scalar(select(Run).where(Run.id == run_id, Run.tenant_id == tenant_id))
    if run is None:
        raise NotFound(f"no run {run_id!r}", field="run_id")
    return run


def _encode_cursor(run: Run) -> str:
    created = run.created_at
    if created.tzinfo is None:  # SQLite returns stored UTC times without a zone
        created = created.replace(tzinfo=UTC)
    raw = json.dumps([created.isoformat(), run.id])
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not isinstance(run_id, str):
            raise ValueError("not a cursor of ours")
        return when, run_id
    except (ValueError, TypeError) as exc:
        raise BadRequest(
            "cursor is not one this API returned; pass next_cursor unchanged", field="cursor"
        ) from exc


async def list_runs(
    session: AsyncSession, tenant_id: str, *, status: str | None, cursor: str | None, limit: int
) -> tuple[list[Run], str | None]:
    """Newest first; keyset pages on (created_at, id)."""
    query = select(Run).where(Run.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Run.status == status)
    if cursor is not None:
        created, run_id = _decode_cursor(cursor)
        query = query.where(
            or_(Run.created_at < created, and_(Run.created_at == created, Run.id < run_id))
        )
    rows = list(
        await session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit + 1))
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (_encode_cursor(rows[-1]) if more and rows else None)


async def cancel_run(session: AsyncSession, tenant_id: str, run_id: str) -> Run:
    """Queued runs end now; running ones are told at their next heartbeat."""
    run = await get_run(session, tenant_id, run_id)
    if run.status == run_states.QUEUED:
        run_states.transition(session, run, run_states.CANCELLED, reason="cancelled by the owner")
    elif run.status in (run_states.STARTING, run_states.RUNNING):
        run.cancel_requested = True
        run.updated_at = utcnow()
    else:
        raise Conflict(
            f"run {run.id} is {run.status}; only unfinished runs can be cancelled", field="status"
        )
    await session.flush()
    return run


async def list_events(
    session: AsyncSession, tenant_id: str, run_id: str, *, after: int | None = None
) -> list[RunEvent]:
    """The run's transitions, oldest first; ``after``: only those with a greater id."""
    await get_run(session, tenant_id, run_id)
    query = select(RunEvent).where(RunEvent.run_id == run_id)
    if after is not None:
        query = query.where(RunEvent.id > after)
    return list(await session.scalars(query.order_by(RunEvent.id)))


async def query_metrics(
    session: AsyncSession,
    tenant_id: str,
    run_id: str,
    *,
    name: str | None,
    since_step: int | None,
    until_step: int | None,
) -> list[MetricPoint]:
    await get_run(session, tenant_id, run_id)
    _require_storable(name, "name")
    query = select(MetricPoint).where(MetricPoint.run_id == run_id)
    if name is not None:
        query = query.where(MetricPoint.name == name)
    if since_step is not None:
        query = query.where(MetricPoint.step >= since_step)
    if until_step is not None:
        query = query.where(MetricPoint.step <= until_step)
    return list(await session.scalars(query.order_by(MetricPoint.name, MetricPoint.step)))


def _require_storable(text: str | None, field: str) -> None:
    """A string bound for (or compared with) a text column: Postgres refuses NUL in one,
    which would fail the statement (a 500); it is the caller's to leave out (a 422)."""
    if text is not None and "\x00" in text:
        raise Unprocessable(f"{field} contains a NUL character (\\u0000)", field=field)


def _require_shared_safe(spec: JobSpec) -> None:
    """What a tenant's spec may not ask of a shared worker, whatever its own validity."""
    problem = shared_model_source_problem(spec.model)
    if problem:
        raise Unprocessable(problem, field="spec.model.source")
    if spec.rollout.vllm_url is not None:
        # The worker would post to it, and tell it to load files by path: an address of
        # the operator's to give, not a tenant's (leave it out: the worker starts one).
        raise Unprocessable(
            "rollout.vllm_url is not accepted from tenants; leave it out and the worker "
            "starts a vLLM server for the run",
            field="spec.rollout.vllm_url",
        )
