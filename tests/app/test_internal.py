"""The worker API on real Postgres: claim, heartbeat, status reports, metric ingest."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from app.db.models import MetricPoint, Run, utcnow
from tests.app.conftest import WORKER, Api, lease

pytestmark = pytest.mark.anyio


async def test_the_worker_token_is_required_to_claim(api: Api) -> None:
    tenant_key = await api.tenant()
    run_id = await api.submit(tenant_key)
    # A tenant's API key is not a worker token.
    for headers in ({}, {"Authorization": "Bearer wrong"}, tenant_key):
        r = await api.client.post(
            f"/internal/runs/{run_id}/claim", json={"worker_id": "w"}, headers=headers
        )
        assert r.status_code == 401, headers
        assert r.json()["error"]["field"] == "Authorization"


async def test_a_runs_other_routes_take_its_lease_token_only(api: Api) -> None:
    tenant_key = await api.tenant()
    run_id = await api.submit(tenant_key)
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    bodies = {
        "heartbeat": {"worker_id": "w1"},
        "status": {"worker_id": "w1", "status": "running"},
        "metrics": {"worker_id": "w1", "seq": 0, "points": []},
    }
    refusals = (
        ({}, 401, "missing Authorization header"),
        (lease("wrong"), 403, f"this lease token does not hold run {run_id}"),
        (tenant_key, 403, f"this lease token does not hold run {run_id}"),
        (WORKER, 403, "the worker token opens only claims"),
    )
    for action, body in bodies.items():
        for headers, status, message in refusals:
            r = await api.client.post(
                f"/internal/runs/{run_id}/{action}", json=body, headers=headers
            )
            assert r.status_code == status, (action, headers, r.text)
            error = r.json()["error"]
            assert error["field"] == "Authorization" and message in error["message"], error
    run = await api.db(lambda s: s.get(Run, run_id))
    assert run is not None and run.status == "starting"  # nothing refused moved it


async def test_a_run_through_its_life(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    before = utcnow()
    claim = await api.internal(run_id, "claim", worker_id="w1", lease_seconds=30)
    assert claim.status_code == 200, claim.text
    body = claim.json()
    assert set(body) == {
        "run_id", "spec", "attempt", "lease_expires_at", "resume_step", "checkpoint",
        "environment", "scorer", "judge", "lease_token",
    }  # fmt: skip
    assert body["lease_token"].startswith("rlaas_lease_")
    assert body["environment"] is None  # a built-in environment: nothing to hand over
    assert body["scorer"] is None  # and no webhook verifier
    assert body["judge"] is None  # nor an LLM judge
    assert body["run_id"] == run_id and body["attempt"] == 1 and body["resume_step"] == 0
    assert body["spec"]["environment"]["name"] == "guess_number"
    expires = datetime.fromisoformat(body["lease_expires_at"])
    assert before + timedelta(seconds=29) < expires < utcnow() + timedelta(seconds=31)
    assert (await api.internal(run_id, "claim", worker_id="w2")).status_code == 409  # taken

    r = await api.internal(run_id, "status", worker_id="w1", status="running")
    assert r.json() == {"status": "running"}
    points = [
        {"step": 1, "name": "reward/mean", "value": 0.25},
        {"step": 1, "name": "loss", "value": 1.5},
    ]
    r = await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=points)
    assert r.json() == {"accepted": 2, "duplicate": False}
    beat = await api.internal(run_id, "heartbeat", worker_id="w1")
    assert beat.status_code == 200 and beat.json()["cancel_requested"] is False
    r = await api.internal(run_id, "status", worker_id="w1", status="succeeded")
    assert r.status_code == 200 and r.json() == {"status": "succeeded"}

    run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "succeeded" and run["current_step"] == 1 and run["attempts"] == 1
    assert run["started_at"] and run["finished_at"] and run["error"] is None
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [
        (None, "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "succeeded"),
    ]
    # Which credential claimed: an operator can tell which worker held the run.
    claimed = "claimed by w1, with worker credential wcr_test_worker (test-worker)"
    assert events[1]["reason"] == claimed
    metrics = await api.client.get(
        f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"}, headers=auth
    )
    assert metrics.json()["points"] == [{"step": 1, "name": "reward/mean", "value": 0.25}]
    # A finished run holds no lease: its token reports nothing more.
    for action, extra in (("status", {"status": "failed"}), ("heartbeat", {})):
        r = await api.internal(run_id, action, worker_id="w1", **extra)
        assert r.status_code == 403, action
        assert f"does not hold run {run_id}" in r.json()["error"]["message"]
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 409


async def test_only_the_lease_holder_may_report(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    for action, extra in (
        ("heartbeat", {}),
        ("status", {"status": "running"}),
        ("metrics", {"seq": 0, "points": [{"step": 7, "name": "x", "value": 1.0}]}),
    ):
        r = await api.internal(run_id, action, worker_id="intruder", **extra)
        assert r.status_code == 409, action
        assert r.json()["error"]["field"] == "worker_id"
    assert await api.db(lambda s: s.scalar(select(func.count()).select_from(MetricPoint))) == 0
    # The refused batch moved nothing: its run update went with the rolled-back transaction.
    run = await api.db(lambda s: s.get(Run, run_id))
    assert run is not None and run.current_step == 0
    ok = await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=[])
    assert ok.json() == {"accepted": 0, "duplicate": False}  # its seq was not taken either


async def test_an_unknown_run_is_404_for_the_worker(api: Api) -> None:
    r = await api.internal("run_missing", "claim", worker_id="w1")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ([], "succeeded"),  # starting → succeeded skips running
        (["running"], "running"),  # running → running is no transition
    ],
)
async def test_an_illegal_transition_is_409_naming_the_current_state(
    api: Api, path: list[str], target: str
) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    for status in path:
        assert (await api.internal(run_id, "status", worker_id="w1", status=status)).is_success
    current = path[-1] if path else "starting"
    r = await api.internal(run_id, "status", worker_id="w1", status=target)
    assert r.status_code == 409
    assert current in r.json()["error"]["message"], r.json()


async def test_a_worker_may_not_set_a_status_outside_its_vocabulary(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    for status in ("queued", "starting", "done"):
        r = await api.internal(run_id, "status", worker_id="w1", status=status)
        assert r.status_code == 422 and r.json()["error"]["field"] == "status"


async def test_a_failure_report_keeps_the_error(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    r = await api.internal(run_id, "status", worker_id="w1", status="failed", error="OOM at step 3")
    assert r.json() == {"status": "failed"}
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "failed" and run["error"] == "OOM at step 3"
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert events[-1]["reason"] == "OOM at step 3"


async def test_a_retried_metric_batch_is_stored_once(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    batch = [{"step": s, "name": "reward/mean", "value": s / 10} for s in range(1, 4)]
    first = await api.internal(run_id, "metrics", worker_id="w1", seq=7, points=batch)
    changed = [{**p, "value": 99.0} for p in batch]
    retry = await api.internal(run_id, "metrics", worker_id="w1", seq=7, points=changed)
    assert first.json() == {"accepted": 3, "duplicate": False}
    assert retry.json() == {"accepted": 0, "duplicate": True}
    values = await api.db(lambda s: s.scalars(select(MetricPoint.value).order_by("step")))
    assert list(values) == [0.1, 0.2, 0.3]  # the retry stored nothing


async def test_a_point_sent_again_in_a_new_batch_overwrites(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.internal(
        run_id, "metrics", worker_id="w1", seq=0, points=[{"step": 5, "name": "x", "value": 1.0}]
    )
    await api.internal(
        run_id, "metrics", worker_id="w1", seq=1, points=[{"step": 5, "name": "x", "value": 2.0}]
    )
    await api.internal(
        run_id, "metrics", worker_id="w1", seq=2, points=[{"step": 2, "name": "x", "value": 3.0}]
    )
    r = await api.client.get(f"/v1/runs/{run_id}/metrics", headers=auth)
    assert r.json()["points"] == [
        {"step": 2, "name": "x", "value": 3.0},
        {"step": 5, "name": "x", "value": 2.0},
    ]
    # current_step is the highest step seen, never lowered by a late batch.
    run = await api.db(lambda s: s.get(Run, run_id))
    assert run is not None and run.current_step == 5
    empty = await api.internal(run_id, "metrics", worker_id="w1", seq=3, points=[])
    assert empty.json() == {"accepted": 0, "duplicate": False}


async def test_within_one_batch_the_last_value_of_a_point_wins(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    points = [
        {"step": 1, "name": "x", "value": 1.0},
        {"step": 1, "name": "y", "value": 5.0},
        {"step": 1, "name": "x", "value": 2.0},
        {"step": 0, "name": "x", "value": 7.0},
        {"step": 1, "name": "x", "value": 3.0},
    ]
    r = await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=points)
    assert r.json() == {"accepted": 5, "duplicate": False}
    r = await api.client.get(f"/v1/runs/{run_id}/metrics", headers=auth)
    assert r.json()["points"] == [
        {"step": 0, "name": "x", "value": 7.0},
        {"step": 1, "name": "x", "value": 3.0},
        {"step": 1, "name": "y", "value": 5.0},
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"worker_id": "w1", "seq": -1, "points": []}', "seq"),
        (b'{"worker_id": "w1", "seq": 0, "points": [{"step": -1, "name": "x", "value": 1}]}',
         "points.0.step"),
        (b'{"worker_id": "w1", "seq": 0, "points": [{"step": 1, "name": "x", "value": NaN}]}',
         "points.0.value"),
        (b'{"worker_id": "w1", "seq": 0, "points": [{"step": 1, "name": "x", "value": 1e999}]}',
         "points.0.value"),
        (b'{"worker_id": "w1", "seq": 0, "points": [{"step": 1, "name": "", "value": 1}]}',
         "points.0.name"),
    ],
)  # fmt: skip
async def test_bad_metric_batches_are_422_naming_the_field(
    api: Api, body: bytes, field: str
) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    r = await api.client.post(
        f"/internal/runs/{run_id}/metrics",
        content=body,
        headers={**lease(api.leases[run_id]), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


async def test_cancel_reaches_the_worker_on_its_heartbeat(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.internal(run_id, "status", worker_id="w1", status="running")
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert r.status_code == 200
    assert r.json()["status"] == "running" and r.json()["cancel_requested"] is True
    beat = await api.internal(run_id, "heartbeat", worker_id="w1")
    assert beat.json()["cancel_requested"] is True
    r = await api.internal(run_id, "status", worker_id="w1", status="cancelled")
    assert r.json() == {"status": "cancelled"}
    statuses = [
        e["to_status"]
        for e in (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    ]
    assert statuses == ["queued", "starting", "running", "cancelled"]


async def test_a_run_cancelled_while_starting_is_told_and_may_end_at_once(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert r.json()["status"] == "starting" and r.json()["cancel_requested"] is True
    assert (await api.internal(run_id, "heartbeat", worker_id="w1")).json()["cancel_requested"]
    r = await api.internal(run_id, "status", worker_id="w1", status="cancelled")
    assert r.json() == {"status": "cancelled"}


async def test_a_heartbeat_extends_the_lease(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    claim = await api.internal(run_id, "claim", worker_id="w1", lease_seconds=5)
    first = datetime.fromisoformat(claim.json()["lease_expires_at"])
    beat = await api.internal(run_id, "heartbeat", worker_id="w1", lease_seconds=600)
    assert datetime.fromisoformat(beat.json()["lease_expires_at"]) > first + timedelta(minutes=9)
