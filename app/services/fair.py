"""Which queued run a worker takes next: fair between tenants, not first come first served.

Each Celery message names a run, but a worker that asks for a fair claim takes the queued
run this order puts first, so a tenant with many queued runs cannot starve another's one:

1. the tenant with the fewest runs ``starting`` or ``running`` (a share of the workers);
2. then the tenant whose last claim is oldest (never claimed first): round-robin, which
   decides it when one worker serves everyone and every count is zero;
3. then, within the tenant, a run on a base model the claiming worker holds (a worker
   hosting several runs says which it holds: docs/shared-base.md), so runs of one base
   meet on one worker without one tenant passing another;
4. then its oldest run (a re-queued run goes again before later ones).

The choice and the lease are one transaction: the row is locked ``FOR UPDATE SKIP
LOCKED``, so two workers claiming at once take two different runs, and the lease still
decides who runs. The order is read from the claim's snapshot: two claims at the same
instant may both count a tenant as idle, a fairness error of one run that the next claim
corrects. Every queued run has a message of its own (sent at submit, again by the reaper),
so there are never fewer messages than queued runs: a message whose run another claim
took earlier takes a later one, and one that finds nothing queued is a 409 and dropped.

Runs go to the queue of their accelerator (app.routing), and a message came off the
queue of its run's, so the claim chooses among the queued runs of that accelerator only:
a GPU worker never takes a CPU run, and the count of messages still matches the count of
queued runs queue by queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, Tenant
from app.services import run_states


async def next_queued_run(
    session: AsyncSession,
    accelerator: str | None,
    default_accelerator: str,
    prefer_bases: Sequence[str] = (),
) -> Run | None:
    """The queued run of ``accelerator`` that fair order puts first, locked; None if no
    such run is queued (or all are being claimed by others right now). A run with no
    accelerator (stored before runs had one) is of ``default_accelerator``, as is
    ``accelerator`` None. ``prefer_bases``: model sources the claimer holds (rule 3)."""
    within_tenant: list[Any] = [Run.created_at, Run.id]
    if prefer_bases:
        source = Run.spec["model"]["source"].as_string()
        within_tenant.insert(0, case((source.in_(list(prefer_bases)), 0), else_=1))
    wanted = accelerator or default_accelerator
    active = (
        select(Run.tenant_id, func.count().label("n"))
        .where(Run.status.in_((run_states.STARTING, run_states.RUNNING)))
        .group_by(Run.tenant_id)
        .subquery()
    )
    run: Run | None = await session.scalar(
        select(Run)
        .join(Tenant, Tenant.id == Run.tenant_id)
        .outerjoin(active, active.c.tenant_id == Run.tenant_id)
        .where(
            Run.status == run_states.QUEUED,
            func.coalesce(Run.accelerator, default_accelerator) == wanted,
        )
        .order_by(
            func.coalesce(active.c.n, 0),
            Tenant.last_claim_at.asc().nulls_first(),
            *within_tenant,
        )
        .limit(1)
        .with_for_update(of=Run, skip_locked=True)
    )
    return run
