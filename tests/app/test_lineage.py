"""The updates a run's policy holds (GET /v1/runs/{id}/lineage), on real Postgres: a step
redone after a resume replaces the lost one; a step trained twice is refused or named."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from app.db.models import MetricPoint, StepUpdate
from tests.app.conftest import Api
from tests.app.test_leases import reap_at

pytestmark = pytest.mark.anyio


def update(step: int, attempt: int, base: tuple[int, int], count: int | None = None) -> Any:
    return {
        "step": step,
        "attempt": attempt,
        "base_step": base[0],
        "base_attempt": base[1],
        "optimizer_updates": step if count is None else count,
    }


async def report(api: Api, run_id: str, worker: str, seq: int, *updates: Any) -> Any:
    points = [{"step": u["step"], "name": "loss", "value": 0.1} for u in updates]
    return await api.internal(
        run_id, "metrics", worker_id=worker, seq=seq, points=points, updates=list(updates)
    )


async def checkpoint(api: Api, run_id: str, worker: str, step: int) -> None:
    r = await api.internal(
        run_id, "artifacts", worker_id=worker, kind="checkpoint", step=step, uri=f"file:///c/{step}"
    )
    assert r.status_code < 300, r.text


async def test_a_step_redone_after_a_resume_replaces_the_lost_update(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    # Attempt 1 trains steps 1-3, saves step 2, and dies: its step 3 is lost.
    await api.internal(run_id, "claim", worker_id="w1")
    await report(api, run_id, "w1", 1_000_000_000, update(1, 1, (0, 0)), update(2, 1, (1, 1)))
    await checkpoint(api, run_id, "w1", 2)
    await report(api, run_id, "w1", 1_000_000_001, update(3, 1, (2, 1)))
    await reap_at(api, 3600)
    # Attempt 2 resumes from step 2 (the claim says which attempt's policy that is).
    claim = (await api.internal(run_id, "claim", worker_id="w2")).json()
    assert claim["checkpoint"]["step"] == 2 and claim["checkpoint"]["attempt"] == 1
    await report(api, run_id, "w2", 2_000_000_000, update(3, 2, (2, 1)), update(4, 2, (3, 2)))
    await checkpoint(api, run_id, "w2", 4)

    lineage = (await api.client.get(f"/v1/runs/{run_id}/lineage", headers=auth)).json()
    assert lineage["problems"] == []
    assert (lineage["policy_step"], lineage["policy_attempt"]) == (4, 2)
    assert [(s["step"], s["attempt"], s["replaced"]) for s in lineage["steps"]] == [
        (1, 1, []),
        (2, 1, []),
        (3, 2, [1]),
        (4, 2, []),
    ]


async def test_a_step_one_attempt_reports_twice_is_refused_and_nothing_of_it_stored(
    api: Api,
) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    assert (await report(api, run_id, "w1", 1, update(1, 1, (0, 0)))).status_code == 200
    again = await report(api, run_id, "w1", 2, update(1, 1, (0, 0)))
    assert again.status_code == 409
    assert "trained twice" in again.json()["error"]["message"]
    twice_in_one = await report(api, run_id, "w1", 3, update(2, 1, (1, 1)), update(2, 1, (1, 1)))
    assert twice_in_one.status_code == 409
    # Refused whole: neither the updates nor the points of those batches were stored.
    assert await api.db(lambda s: s.scalar(select(func.count()).select_from(StepUpdate))) == 1
    loss = select(func.count()).select_from(MetricPoint).where(MetricPoint.run_id == run_id)
    assert await api.db(lambda s: s.scalar(loss)) == 1


async def test_an_update_in_the_name_of_another_attempt_is_refused(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    r = await report(api, run_id, "w1", 1, update(1, 2, (0, 0)))
    assert r.status_code == 409 and "lease of attempt 1" in r.json()["error"]["message"]


async def test_a_policy_missing_or_doubling_a_step_is_named(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    # Step 3 applied to step 1's policy (step 2 is not in it); step 4's optimiser count
    # says the policy holds one update more than its steps: one was applied twice.
    await report(
        api,
        run_id,
        "w1",
        1,
        update(1, 1, (0, 0)),
        update(3, 1, (1, 1)),
        update(4, 1, (3, 1), count=5),
    )
    await checkpoint(api, run_id, "w1", 4)
    lineage = (await api.client.get(f"/v1/runs/{run_id}/lineage", headers=auth)).json()
    assert [s["step"] for s in lineage["steps"]] == [1, 3, 4]
    problems = lineage["problems"]
    assert len(problems) == 2, problems
    assert "step 3 (attempt 1) was applied to the policy of step 1" in problems[0]
    assert "step 4 (attempt 1): the policy holds 5 optimiser updates, 4 expected" in problems[1]
    assert problems[1].endswith("twice")
