"""The worker API on real Postgres: claim, heartbeat, status, metric ingest, leases."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update

from app.db.models import MetricPoint, Run, utcnow
from app.main import reap_once
from tests.app.conftest import WORKER, Api, spec


def submit(api: Api, auth: dict[str, str]) -> str:
    return str(api.client.post("/v1/runs", json={"spec": spec()}, headers=auth).json()["id"])


def post(api: Api, run_id: str, action: str, **body: object):  # type: ignore[no-untyped-def]
    return api.client.post(f"/internal/runs/{run_id}/{action}", json=body, headers=WORKER)


def expire_lease(api: Api, run_id: str) -> None:
    past = utcnow() - timedelta(seconds=1)
    api.db(lambda s: s.execute(update(Run).where(Run.id == run_id).values(lease_expires_at=past)))


def test_worker_token_is_required(api: Api) -> None:
    run_id = submit(api, api.tenant())
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = api.client.post(
            f"/internal/runs/{run_id}/claim", json={"worker_id": "w"}, headers=headers
        )
        assert r.status_code == 401
    tenant_key = api.tenant()
    r = api.client.post(
        f"/internal/runs/{run_id}/claim", json={"worker_id": "w"}, headers=tenant_key
    )
    assert r.status_code == 401  # a tenant key is not a worker token


def test_a_run_through_its_life(api: Api) -> None:
    auth = api.tenant()
    run_id = submit(api, auth)
    claim = post(api, run_id, "claim", worker_id="w1", lease_seconds=30)
    assert claim.status_code == 200, claim.text
    assert claim.json()["attempt"] == 1 and claim.json()["resume_step"] == 0
    assert claim.json()["spec"]["environment"]["name"] == "guess_number"
    assert post(api, run_id, "claim", worker_id="w2").status_code == 409  # taken
    assert post(api, run_id, "status", worker_id="w1", status="running").json() == {
        "status": "running"
    }
    points = [
        {"step": 1, "name": "reward/mean", "value": 0.25},
        {"step": 1, "name": "loss", "value": 1.5},
    ]
    assert post(api, run_id, "metrics", worker_id="w1", seq=0, points=points).json() == {
        "accepted": 2,
        "duplicate": False,
    }
    beat = post(api, run_id, "heartbeat", worker_id="w1")
    assert beat.status_code == 200 and beat.json()["cancel_requested"] is False
    assert post(api, run_id, "heartbeat", worker_id="intruder").status_code == 409
    assert post(api, run_id, "status", worker_id="w1", status="succeeded").status_code == 200

    run = api.client.get(f"/v1/runs/{run_id}", headers=auth).json()
    assert run["status"] == "succeeded" and run["current_step"] == 1
    assert run["started_at"] and run["finished_at"]
    events = api.client.get(f"/v1/runs/{run_id}/events", headers=auth).json()["items"]
    assert [e["to_status"] for e in events] == ["queued", "starting", "running", "succeeded"]
    metrics = api.client.get(
        f"/v1/runs/{run_id}/metrics", params={"name": "reward/mean"}, headers=auth
    ).json()
    assert metrics["points"] == [{"step": 1, "name": "reward/mean", "value": 0.25}]
    # A finished run has no lease: the worker can no longer report.
    assert post(api, run_id, "status", worker_id="w1", status="failed").status_code == 409


def test_illegal_transition_is_409_naming_the_state(api: Api) -> None:
    run_id = submit(api, api.tenant())
    post(api, run_id, "claim", worker_id="w1")
    r = post(api, run_id, "status", worker_id="w1", status="succeeded")  # starting → succeeded
    assert r.status_code == 409
    assert "starting" in r.json()["error"]["message"]


def test_a_retried_metric_batch_is_stored_once(api: Api) -> None:
    run_id = submit(api, api.tenant())
    post(api, run_id, "claim", worker_id="w1")
    batch = [{"step": s, "name": "reward/mean", "value": s / 10} for s in range(1, 4)]
    first = post(api, run_id, "metrics", worker_id="w1", seq=7, points=batch)
    retry = post(api, run_id, "metrics", worker_id="w1", seq=7, points=batch)
    assert first.json() == {"accepted": 3, "duplicate": False}
    assert retry.json() == {"accepted": 0, "duplicate": True}
    stored = api.db(lambda s: s.scalar(select(func.count()).select_from(MetricPoint)))
    assert stored == 3
    bad = post(api, run_id, "metrics", worker_id="w1", seq=-1, points=batch)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "seq"


def test_cancel_reaches_the_worker_on_its_heartbeat(api: Api) -> None:
    auth = api.tenant()
    run_id = submit(api, auth)
    post(api, run_id, "claim", worker_id="w1")
    post(api, run_id, "status", worker_id="w1", status="running")
    r = api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert r.json()["status"] == "running" and r.json()["cancel_requested"] is True
    assert post(api, run_id, "heartbeat", worker_id="w1").json()["cancel_requested"] is True
    assert post(api, run_id, "status", worker_id="w1", status="cancelled").status_code == 200


def test_expired_lease_is_requeued_then_failed_after_max_attempts(api: Api) -> None:
    auth = api.tenant()
    run_id = submit(api, auth)
    api.dispatcher.sent.clear()
    for attempt in range(1, 4):
        claim = post(api, run_id, "claim", worker_id=f"w{attempt}")
        assert claim.json()["attempt"] == attempt
        assert api.call(reap_once, api.state) == []  # a live lease is left alone
        expire_lease(api, run_id)
        requeued = api.call(reap_once, api.state)
        status = api.client.get(f"/v1/runs/{run_id}", headers=auth).json()
        if attempt < 3:
            assert requeued == [run_id] and status["status"] == "queued"
        else:
            assert requeued == [] and status["status"] == "failed"
            assert "lease expired 3 times" in status["error"]
    assert api.dispatcher.sent == [run_id, run_id]  # dispatched again after each re-queue
    assert post(api, run_id, "heartbeat", worker_id="w3").status_code == 409
