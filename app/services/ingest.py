"""Storing what a worker reports: numbered batches of points, spans and trajectories; artifacts.

Each batch is one transaction (the request's): its ``ingest_batches`` row and
its rows commit together or not at all, so a batch that fails leaves nothing
behind and its retry is stored, not skipped as a duplicate.

Why the bulk path looks like this: on Postgres every batch is one ``INSERT ...
SELECT FROM json_to_recordset(document)`` statement, whatever its size: one
parse, one plan, one parameter, instead of thousands of bound values (B8 in
``bench/`` measures it). SQLite (embedded) takes an executemany.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from pydantic import TypeAdapter
from sqlalchemy import Table, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import (
    Artifact,
    Base,
    IngestBatch,
    MetricPoint,
    Run,
    Span,
    StepUpdate,
    Trajectory,
    utcnow,
)
from app.errors import BadRequest, Conflict
from app.schemas.internal import PointIn, UpdateIn
from app.schemas.results import ArtifactBody, SpanIn, TrajectoryIn


def _postgres(session: AsyncSession) -> bool:
    return session.bind.dialect.name == "postgresql"


async def claim_seq(session: AsyncSession, run_id: str, kind: str, seq: int) -> bool:
    """Record batch ``seq`` of ``kind``; False if it was stored before (a retry)."""
    insert = pg_insert if _postgres(session) else sqlite_insert
    stmt = (
        insert(IngestBatch)
        .values(run_id=run_id, kind=kind, seq=seq, created_at=utcnow())
        .on_conflict_do_nothing()
        .returning(IngestBatch.seq)
    )
    return (await session.execute(stmt)).first() is not None


async def bulk_insert(
    session: AsyncSession,
    model: type[Base],
    rows: Sequence[Mapping[str, Any]],
    *,
    upsert: tuple[Sequence[str], Sequence[str]] | None = None,
) -> None:
    """Insert ``rows`` (dicts with the same keys) in one statement on Postgres.

    ``upsert`` = (conflict columns, columns to overwrite): on conflict the new
    values win. ``rows`` must not repeat a conflict key (Postgres refuses to
    touch a row twice in one statement).
    """
    if not rows:
        return
    table = cast(Table, model.__table__)
    columns = list(rows[0])
    if not _postgres(session):
        insert = sqlite_insert(table)
        if upsert is not None:
            keys, overwrite = upsert
            insert = insert.on_conflict_do_update(
                index_elements=list(keys), set_={c: insert.excluded[c] for c in overwrite}
            )
        await session.execute(insert, list(rows))
        return
    dialect = session.bind.dialect
    # The whole batch travels as one JSON document that Postgres unpacks into typed
    # rows: json.dumps is C, where binding per-column arrays escapes every string in Python.
    record = ", ".join(f'"{c}" {table.c[c].type.compile(dialect=dialect)}' for c in columns)
    names = ", ".join(columns)
    sql = (
        f"INSERT INTO {table.name} ({names}) SELECT {names} "
        f"FROM json_to_recordset(CAST(:rows AS json)) AS x({record})"
    )
    if upsert is not None:
        keys, overwrite = upsert
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in overwrite)
        sql += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
    document = json.dumps(list(rows), default=_iso, separators=(",", ":"))
    await session.execute(text(sql), {"rows": document})


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


async def store_points(session: AsyncSession, run_id: str, points: Sequence[PointIn]) -> None:
    """Upsert ``points`` of a run; a point sent again overwrites, the last one in a batch wins.

    Moving the run's ``current_step`` and noting it for the live streams is the caller's
    (``workers.ingest_metrics``), which knows the batch's newest step already.
    """
    if not points:
        return
    if _postgres(session):
        # The points go to Postgres as the JSON pydantic-core writes (no Python object
        # per point); DISTINCT ON keeps a batch's last value of a (step, name), since
        # one statement may not touch a row twice.
        document = _POINTS_JSON.dump_json(list(points)).decode()
        await session.execute(_UPSERT_POINTS, {"run_id": run_id, "points": document})
    else:
        latest = {(p.step, p.name): p.value for p in points}
        rows = [
            {"run_id": run_id, "name": name, "step": step, "value": value}
            for (step, name), value in latest.items()
        ]
        upsert = (("run_id", "name", "step"), ("value",))
        await bulk_insert(session, MetricPoint, rows, upsert=upsert)


_POINTS_JSON = TypeAdapter(list[PointIn])
_UPSERT_POINTS = text(
    "INSERT INTO metric_points (run_id, name, step, value) "
    "SELECT DISTINCT ON (x.step, x.name) CAST(:run_id AS varchar), x.name, x.step, x.value "
    "FROM ROWS FROM (json_to_recordset(CAST(:points AS json)) "
    "AS (step integer, name varchar(200), value double precision)) "
    "WITH ORDINALITY AS x(step, name, value, n) "
    "ORDER BY x.step, x.name, x.n DESC "
    "ON CONFLICT (run_id, name, step) DO UPDATE SET value = EXCLUDED.value"
)


async def store_updates(
    session: AsyncSession, run_id: str, attempt: int, updates: Sequence[UpdateIn]
) -> None:
    """Record the policy updates of attempt ``attempt`` (the lease's: a worker cannot speak
    for another attempt). A step this attempt reported before is refused: one attempt trains
    each step once, so a second update of it would be trained twice into the same policy.
    The same step from a later attempt is a new row (a redo after a resume)."""
    if not updates:
        return
    for u in updates:
        if u.attempt != attempt:
            raise Conflict(
                f"an update of step {u.step} from attempt {u.attempt} was sent with the lease "
                f"of attempt {attempt}",
                field="updates",
            )
        if u.base_step >= u.step:
            raise BadRequest(
                f"step {u.step} cannot be applied to the policy of step {u.base_step}",
                field="updates",
            )
    steps = [u.step for u in updates]
    again = set(
        await session.scalars(
            select(StepUpdate.step).where(
                StepUpdate.run_id == run_id,
                StepUpdate.attempt == attempt,
                StepUpdate.step.in_(steps),
            )
        )
    )
    again |= {s for s, n in Counter(steps).items() if n > 1}
    if again:
        raise Conflict(
            f"attempt {attempt} reported steps {sorted(again)} a second time: a step "
            "trained twice into one policy",
            field="updates",
        )
    now = utcnow()
    rows = [{"run_id": run_id, **u.model_dump(), "created_at": now} for u in updates]
    await bulk_insert(session, StepUpdate, rows)


async def store_spans(session: AsyncSession, run_id: str, spans: Sequence[SpanIn]) -> None:
    rows = [
        {
            "run_id": run_id,
            "name": s.name,
            "track": s.track,
            "step": s.step,
            "start_us": s.start_us,
            "dur_us": s.dur_us,
            "args": s.args or None,
        }
        for s in spans
    ]
    await bulk_insert(session, Span, rows)


async def store_trajectories(
    session: AsyncSession, run_id: str, trajectories: Sequence[TrajectoryIn]
) -> None:
    now = utcnow()
    rows = []
    for t in trajectories:
        record = t.model_dump(mode="json")
        rows.append(
            {
                "run_id": run_id,
                "step": t.step,
                "episode_id": t.episode_id,
                "policy_version": t.policy_version,
                "reward": t.reward,
                "end_state": t.end_state,
                "record": record,
                "created_at": now,
            }
        )
    await bulk_insert(session, Trajectory, rows)


async def store_artifact(session: AsyncSession, run: Run, body: ArtifactBody) -> None:
    """Record an artifact once per (run, kind, step); a resumed attempt's copy replaces it."""
    insert = pg_insert if _postgres(session) else sqlite_insert
    stmt = insert(Artifact).values(
        run_id=run.id,
        kind=body.kind,
        step=body.step,
        uri=body.uri,
        size_bytes=body.size_bytes,
        attempt=run.attempts,
        created_at=utcnow(),
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["run_id", "kind", "step"],
        set_={"uri": stmt.excluded.uri, "size_bytes": stmt.excluded.size_bytes,
              "attempt": stmt.excluded.attempt},
    )  # fmt: skip
    await session.execute(stmt)
    if body.kind == "checkpoint" and body.stored_bytes is not None:
        run.stored_bytes = body.stored_bytes  # the run's storage use now (its quota's)


async def newest_checkpoint(session: AsyncSession, run_id: str) -> Artifact | None:
    found: Artifact | None = await session.scalar(
        select(Artifact)
        .where(Artifact.run_id == run_id, Artifact.kind == "checkpoint")
        .order_by(Artifact.step.desc())
        .limit(1)
    )
    return found


def take_profile_request(run: Run) -> int | None:
    """The profile asked for since the last heartbeat, handed out once."""
    steps, run.profile_steps_requested = run.profile_steps_requested, None
    return steps
