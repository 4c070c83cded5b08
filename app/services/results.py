"""A run's results as its owner reads them: timeline, trajectories, checkpoints, in-flight work.

Every function takes the caller's tenant and answers NotFound for another
tenant's run (``runs.get_run``), so isolation is decided in one place.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, Run, Span, Trajectory, utcnow
from app.errors import BadRequest, Conflict
from app.services import run_states
from app.services.runs import get_run

# Fixed rows first, in this order; other tracks (episodes) follow by first appearance.
_TRACK_ORDER = ("trainer", "engine", "collector")
# The end states whose episodes may be trained on (rl_core.agent.ledger.KEPT_STATES).
_TRAINABLE_ENDS = frozenset({"done", "truncated"})


async def timeline(
    session: AsyncSession,
    tenant_id: str,
    run_id: str,
    *,
    start_us: int | None,
    end_us: int | None,
    limit: int,
) -> dict[str, Any]:
    """The spans that start in [start_us, end_us), as Chrome trace-event JSON."""
    if start_us is not None and end_us is not None and end_us <= start_us:
        raise BadRequest("end_us must be greater than start_us", field="end_us")
    run = await get_run(session, tenant_id, run_id)
    query = select(Span).where(Span.run_id == run.id)
    if start_us is not None:
        query = query.where(Span.start_us >= start_us)
    if end_us is not None:
        query = query.where(Span.start_us < end_us)
    spans = list(await session.scalars(query.order_by(Span.start_us, Span.id).limit(limit + 1)))
    truncated = len(spans) > limit
    next_start = spans[limit].start_us if truncated else None
    return render_trace(run.id, spans[:limit], truncated=truncated, next_start_us=next_start)


def render_trace(
    run_id: str, spans: list[Span], *, truncated: bool, next_start_us: int | None
) -> dict[str, Any]:
    tids: dict[str, int] = {}
    fixed = [t for t in _TRACK_ORDER if any(s.track == t for s in spans)]
    for track in fixed:
        tids[track] = len(tids) + 1
    for s in spans:
        if s.track not in tids:
            tids[s.track] = len(tids) + 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": f"run {run_id}"}}
    ]
    for track, tid in tids.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}}
        )
        events.append(
            {"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
             "args": {"sort_index": tid}}
        )  # fmt: skip
    for s in spans:
        events.append(
            {
                "name": s.name,
                "cat": "stage",
                "ph": "X",
                "ts": s.start_us,
                "dur": s.dur_us,
                "pid": 1,
                "tid": tids[s.track],
                "args": {"step": s.step, **(s.args or {})},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"run_id": run_id, "truncated": truncated, "next_start_us": next_start_us},
    }


def _encode_cursor(step: int, row_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([step, row_id]).encode()).decode()


def _decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        step, row_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not (isinstance(step, int) and isinstance(row_id, int)):
            raise ValueError("not a cursor of ours")
        return step, row_id
    except (ValueError, TypeError) as exc:
        raise BadRequest(
            "cursor is not one this API returned; pass next_cursor unchanged", field="cursor"
        ) from exc


async def trajectories(
    session: AsyncSession,
    tenant_id: str,
    run_id: str,
    *,
    step: int | None,
    cursor: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None]:
    """Oldest step first, then in arrival order; keyset pages on (step, id)."""
    await get_run(session, tenant_id, run_id)
    query = select(Trajectory.id, Trajectory.step, Trajectory.record).where(
        Trajectory.run_id == run_id
    )
    if step is not None:
        query = query.where(Trajectory.step == step)
    if cursor is not None:
        after_step, after_id = _decode_cursor(cursor)
        query = query.where(
            or_(
                Trajectory.step > after_step,
                and_(Trajectory.step == after_step, Trajectory.id > after_id),
            )
        )
    query = query.order_by(Trajectory.step, Trajectory.id).limit(limit + 1)
    rows = (await session.execute(query)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    items = [{**_untrained_if_failed(record), "id": row_id} for row_id, _, record in rows]
    next_cursor = _encode_cursor(rows[-1][1], rows[-1][0]) if more and rows else None
    return items, next_cursor


def _untrained_if_failed(record: dict[str, Any]) -> dict[str, Any]:
    """A failed, timed-out or cancelled episode taught the policy nothing: none of its text
    reads as trained. Workers before this rule marked its model text ``trained`` as the
    loss mask had it; their rows are read right here."""
    segments = record.get("segments")
    if record.get("end_state") in _TRAINABLE_ENDS or not isinstance(segments, list):
        return record
    return {
        **record,
        "segments": [{**s, "trained": False} if isinstance(s, dict) else s for s in segments],
    }


async def checkpoints(session: AsyncSession, tenant_id: str, run_id: str) -> list[Artifact]:
    await get_run(session, tenant_id, run_id)
    return list(
        await session.scalars(
            select(Artifact)
            .where(Artifact.run_id == run_id, Artifact.kind == "checkpoint")
            .order_by(Artifact.step)
        )
    )


async def inflight(session: AsyncSession, tenant_id: str, run_id: str) -> Run:
    return await get_run(session, tenant_id, run_id)


async def request_profile(session: AsyncSession, tenant_id: str, run_id: str, steps: int) -> int:
    """Ask the run's worker to profile the next ``steps`` steps (told at its next heartbeat)."""
    run = await get_run(session, tenant_id, run_id)
    if run.status in run_states.TERMINAL:
        raise Conflict(
            f"run {run.id} is {run.status}; only unfinished runs can be profiled", field="status"
        )
    run.profile_steps_requested = steps
    run.updated_at = utcnow()
    await session.flush()
    return steps
