"""The worker's side of a run: claim, heartbeat, status reports, metric ingest.

The claim is the one call of a run that a worker's credential opens; it answers a lease token
(``app.security``), and every other call here is made with that token (a `LeaseProof`),
checked against the run's row in the same locked read or update that does the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.crypto import SecretBox
from app.db.models import Artifact, Run, Tenant, utcnow
from app.errors import Conflict, NotFound
from app.live.notes import note_step
from app.schemas import PointIn, UpdateIn
from app.schemas.internal import SandboxIn
from app.schemas.results import ArtifactBody, SpanIn, TrajectoryIn
from app.security import LeaseProof, new_lease_token
from app.services import ingest, run_states, worker_reports
from app.services.fair import next_queued_run
from app.services.worker_credentials import SHARED, WorkerIdentity
from app.services.worker_reports import wall_note


async def _locked_run(session: AsyncSession, run_id: str) -> Run:
    run = await session.scalar(select(Run).where(Run.id == run_id).with_for_update())
    if run is None:
        raise NotFound(f"no run {run_id!r}", field="run_id")
    return run


async def claim(
    session: AsyncSession,
    run_id: str,
    worker_id: str,
    lease_s: float,
    *,
    fair: bool = False,
    sandbox: SandboxIn | None = None,
    credential: WorkerIdentity = SHARED,
    default_accelerator: str,
    bases: Sequence[str] = (),
) -> tuple[Run, str]:
    """Lease a queued run to ``worker_id``; returns (run, the lease token, shown only here).

    ``fair``: not necessarily ``run_id`` but the queued run fair order puts first
    (app.services.fair); 409 if no run is queued. ``sandbox``: the claimer's wall, named
    in the claim's run event and kept for /readyz (app.services.worker_reports).
    ``credential``: what the claimer authenticated with, named in the event and kept on
    the run, so that revoking it ends this lease. ``default_accelerator``: the accelerator
    of a run stored without one (app.routing). ``bases``: with ``fair``, the model sources
    the claimer holds (a worker hosting several runs); within the tenant fair order picks,
    a run on one of them goes first.
    """
    if fair:
        # The message came off the queue of its run's accelerator: the claimer serves that
        # one, and takes only a run of it.
        named = (await session.execute(select(Run.accelerator).where(Run.id == run_id))).first()
        if named is None:
            # Which queue it came off is unknown: dropped, taking nothing.
            raise Conflict(f"no run {run_id}: the message names no run here", field="run_id")
        chosen = await next_queued_run(
            session, named.accelerator, default_accelerator, prefer_bases=bases
        )
        if chosen is None:
            raise Conflict(
                f"no run is queued (run {run_id} was taken by another claim, or ended)",
                field="status",
            )
        run = chosen
    else:
        run = await _locked_run(session, run_id)
        if run.status != run_states.QUEUED:
            raise Conflict(
                f"run {run_id} is {run.status}; only queued runs can be claimed", field="status"
            )
    now = utcnow()
    # The tenant's row is locked until the claim commits (as a submit locks it): the next
    # fair claim sees this one.
    await session.execute(
        update(Tenant).where(Tenant.id == run.tenant_id).values(last_claim_at=now)
    )
    run_states.transition(
        session,
        run,
        run_states.STARTING,
        reason=f"claimed by {worker_id}{wall_note(sandbox)}, with {credential.describe()}",
        now=now,
    )
    if sandbox is not None:
        await worker_reports.record(session, worker_id, sandbox)
    run.attempts += 1
    run.lease_owner = worker_id
    run.lease_credential_id = credential.credential_id
    run.lease_expires_at = now + timedelta(seconds=lease_s)
    token, run.lease_token_hash = new_lease_token()  # the last attempt's token ends here
    if run.gateway_token_encrypted is not None:  # the last attempt served sessions
        run.gateway_token_previous_encrypted = run.gateway_token_encrypted
    run.gateway_url = run.gateway_token_encrypted = None
    await session.flush()
    return run, token


async def _owned_run(session: AsyncSession, run_id: str, lease: LeaseProof, worker_id: str) -> Run:
    """The run, locked, if ``lease`` is its current lease token (403 if not, whether or not
    the run exists: a token opens its own run only, and learns nothing of others)."""
    run = await session.scalar(select(Run).where(Run.id == run_id).with_for_update())
    if run is None or not lease.opens(run.lease_token_hash):
        raise lease.refusal(run_id)
    if run.lease_owner != worker_id:
        raise _not_lease_holder(worker_id, run_id, run.status)
    return run


def _not_lease_holder(worker_id: str, run_id: str, status: str) -> Conflict:
    return Conflict(
        f"worker {worker_id} does not hold the lease on {run_id} (it is {status})",
        field="worker_id",
    )


async def heartbeat(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    lease_s: float,
    inflight: dict[str, Any] | None = None,
) -> tuple[Run, int | None]:
    """Renew the lease and keep the in-flight report; returns (run, profile steps asked for)."""
    run = await _owned_run(session, run_id, lease, worker_id)
    now = utcnow()
    run.lease_expires_at = now + timedelta(seconds=lease_s)
    if inflight is not None:
        run.inflight, run.inflight_at = inflight, now
    profile_steps = ingest.take_profile_request(run)
    await session.flush()
    return run, profile_steps


async def register_gateway(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    url: str,
    token: str,
    box: SecretBox,
) -> Run:
    """Where the lease holder serves this sessions run's gateway (proxied to by the API)."""
    run = await _owned_run(session, run_id, lease, worker_id)
    run.gateway_url = url
    run.gateway_token_encrypted = box.encrypt(token, context=f"gateway:{run.id}")
    await session.flush()
    return run


async def report_status(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    status: str,
    error: str | None,
) -> Run:
    run = await _owned_run(session, run_id, lease, worker_id)
    run_states.transition(session, run, status, reason=error or f"reported by {worker_id}")
    if error is not None:
        run.error = error
    await session.flush()
    return run


async def ingest_metrics(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    seq: int,
    points: Sequence[PointIn],
    updates: Sequence[UpdateIn] = (),
) -> tuple[int, bool]:
    """Store a batch once per (run, seq); returns (points accepted, was a duplicate).

    ``updates`` are the policy updates the batch's steps applied, stored with its points
    (`ingest.store_updates`: a step the same attempt reports twice is refused)."""
    newest = max((p.step for p in points), default=None)
    attempt = await _advance_owned_run(session, run_id, lease, worker_id, newest)
    if not await ingest.claim_seq(session, run_id, "metrics", seq):
        return 0, True  # stored before: the step it moved the run to is already there
    await ingest.store_points(session, run_id, points)
    await ingest.store_updates(session, run_id, attempt, updates)
    if newest is not None:
        note_step(session, run_id, newest)
    return len(points), False


async def _advance_owned_run(
    session: AsyncSession, run_id: str, lease: LeaseProof, worker_id: str, newest: int | None
) -> int:
    """Lock the run, check the lease and move its step forward, in one statement; returns
    the attempt (claim number) the lease belongs to.

    The hottest write path (every step's metrics, B8 and B10 in ``bench/``): one
    ``UPDATE ... RETURNING`` instead of a ``SELECT ... FOR UPDATE`` and a later
    ``UPDATE``. The lease token's hash is part of the statement's condition, so a
    token that does not hold the run updates nothing; a worker id that is not the
    lease owner's fails the request and its transaction, this update included, is
    rolled back.
    """
    values: dict[str, Any] = {"updated_at": utcnow()}
    if newest is not None:
        values["current_step"] = case((Run.current_step < newest, newest), else_=Run.current_step)
    stmt = (
        update(Run)
        .where(Run.id == run_id, Run.lease_token_hash == lease.digest)
        .values(**values)
        .returning(Run.lease_owner, Run.status, Run.attempts)
        .execution_options(synchronize_session=False)
    )
    row = (await session.execute(stmt)).first()
    if row is None:
        raise lease.refusal(run_id)
    if row.lease_owner != worker_id:
        raise _not_lease_holder(worker_id, run_id, row.status)
    return int(row.attempts)


async def ingest_spans(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    seq: int,
    spans: Sequence[SpanIn],
) -> tuple[int, bool]:
    await _owned_run(session, run_id, lease, worker_id)
    if not await ingest.claim_seq(session, run_id, "spans", seq):
        return 0, True
    await ingest.store_spans(session, run_id, spans)
    return len(spans), False


async def ingest_trajectories(
    session: AsyncSession,
    run_id: str,
    lease: LeaseProof,
    worker_id: str,
    seq: int,
    items: Sequence[TrajectoryIn],
) -> tuple[int, bool]:
    await _owned_run(session, run_id, lease, worker_id)
    if not await ingest.claim_seq(session, run_id, "trajectories", seq):
        return 0, True
    await ingest.store_trajectories(session, run_id, items)
    return len(items), False


async def record_artifact(
    session: AsyncSession, run_id: str, lease: LeaseProof, body: ArtifactBody
) -> None:
    run = await _owned_run(session, run_id, lease, body.worker_id)
    await ingest.store_artifact(session, run, body)


async def newest_checkpoint(session: AsyncSession, run_id: str) -> Artifact | None:
    return await ingest.newest_checkpoint(session, run_id)
