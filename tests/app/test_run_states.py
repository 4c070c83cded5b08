"""The one state machine: every pair of states, legal or not, against the real schema."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, RunEvent, Tenant, utcnow
from app.errors import Conflict
from app.services import run_states
from tests.app.conftest import Api

pytestmark = pytest.mark.anyio

LEGAL = {
    ("queued", "starting"),
    ("queued", "cancelled"),
    ("queued", "failed"),  # the reaper: no worker took it within RLAAS_MAX_QUEUED_S
    ("starting", "running"),
    ("starting", "queued"),
    ("starting", "failed"),
    ("starting", "cancelled"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "queued"),
}


def test_the_table_is_exactly_the_designed_one() -> None:
    assert {(a, b) for a, targets in run_states.ALLOWED.items() for b in targets} == LEGAL
    assert set(run_states.ALLOWED) == set(run_states.ALL)
    assert all(not run_states.ALLOWED[t] for t in run_states.TERMINAL)


async def _run_in(session: AsyncSession, status: str) -> Run:
    tenant = Tenant(id=f"ten_{status}", name=f"state-{status}")
    then = utcnow() - timedelta(hours=1)
    run = Run(
        id=f"run_{status}",
        tenant_id=tenant.id,
        status=status,
        spec={},
        lease_owner="w1",
        lease_expires_at=utcnow() + timedelta(minutes=1),
        created_at=then,
        updated_at=then,
    )
    session.add_all([tenant, run])
    await session.flush()
    return run


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(run_states.ALL, run_states.ALL))
)
async def test_every_transition(api: Api, current: str, target: str) -> None:
    async with api.state.sessions() as session:
        run = await _run_in(session, current)
        if (current, target) not in LEGAL:
            with pytest.raises(Conflict) as caught:
                run_states.transition(session, run, target, reason="test")
            assert caught.value.status_code == 409
            assert f"is {current}" in caught.value.message and target in caught.value.message
            assert run.status == current
            return
        run_states.transition(session, run, target, reason="test")
        await session.flush()
        event = await session.scalar(select(RunEvent).where(RunEvent.run_id == run.id))
        assert event is not None
        assert (event.from_status, event.to_status, event.reason) == (current, target, "test")
        assert run.status == target and run.updated_at == event.created_at
        if target in run_states.TERMINAL:
            assert run.finished_at == event.created_at
        if target in run_states.TERMINAL or target == "queued":
            assert run.lease_owner is None and run.lease_expires_at is None
        else:
            assert run.lease_owner == "w1"
        assert (run.started_at is not None) == (target == "running")
