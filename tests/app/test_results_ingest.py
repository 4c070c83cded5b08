"""Worker reports on real Postgres: spans, trajectories, artifacts, in-flight and profile asks."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app.db.models import Artifact, IngestBatch, MetricPoint, Run, Span, Trajectory, utcnow
from app.main import reap_once
from tests.app.conftest import Api, lease

pytestmark = pytest.mark.anyio


def span(i: int, **overrides: Any) -> dict[str, Any]:
    base = {"name": "env_step", "start_us": 1_000 + i, "dur_us": 10, "track": "trainer", "step": 1}
    return {**base, **overrides}


def trajectory(episode: str, step: int = 1, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "episode_id": episode,
        "step": step,
        "policy_version": 0,
        "group": 0,
        "reward": 1.0,
        "turns": 2,
        "end_state": "done",
        "end_reason": None,
        "model_tokens": 12,
        "total_tokens": 40,
        "duration_s": 0.5,
        "segments": [{"text": "hi", "trained": False}, {"text": " 42", "trained": True}],
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
        "info": {"answer": 42},
    }
    return {**base, **overrides}


async def claimed(api: Api) -> tuple[dict[str, str], str]:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 200
    return auth, run_id


async def count(api: Api, model: Any, run_id: str) -> int:
    query = select(func.count()).select_from(model).where(model.run_id == run_id)
    return int(await api.db(lambda s: s.scalar(query)))


async def test_spans_are_stored_once_per_seq(api: Api) -> None:
    _, run_id = await claimed(api)
    batch = [span(i, args={"turn": i, "ok": True}) for i in range(3)]
    first = await api.internal(run_id, "spans", worker_id="w1", seq=0, spans=batch)
    assert first.status_code == 200, first.text
    assert first.json() == {"accepted": 3, "duplicate": False}
    retry = await api.internal(run_id, "spans", worker_id="w1", seq=0, spans=batch)
    assert retry.json() == {"accepted": 0, "duplicate": True}
    # The same seq of another kind is another batch.
    points = [{"step": 1, "name": "x", "value": 1.0}]
    metrics = await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=points)
    assert metrics.json() == {"accepted": 1, "duplicate": False}
    assert await count(api, Span, run_id) == 3
    rows = await api.db(lambda s: s.scalars(select(Span).order_by(Span.start_us)))
    assert [r.args for r in rows] == [{"turn": i, "ok": True} for i in range(3)]


async def test_trajectories_are_stored_once_per_seq(api: Api) -> None:
    _, run_id = await claimed(api)
    batch = [trajectory(f"{run_id}~e{i}") for i in range(4)]
    first = await api.internal(run_id, "trajectories", worker_id="w1", seq=3, trajectories=batch)
    assert first.json() == {"accepted": 4, "duplicate": False}, first.text
    retry = await api.internal(run_id, "trajectories", worker_id="w1", seq=3, trajectories=batch)
    assert retry.json() == {"accepted": 0, "duplicate": True}
    assert await count(api, Trajectory, run_id) == 4
    stored = await api.db(lambda s: s.scalar(select(Trajectory).limit(1)))
    assert stored is not None and stored.record["segments"][1] == {"text": " 42", "trained": True}


async def test_artifacts_are_idempotent_and_the_newest_checkpoint_comes_with_the_claim(
    api: Api,
) -> None:
    _, run_id = await claimed(api)
    for step, uri in ((5, "file:///c/5"), (10, "file:///c/10"), (10, "file:///c/10")):
        r = await api.internal(
            run_id, "artifacts", worker_id="w1", kind="checkpoint", step=step, uri=uri,
            size_bytes=100,
        )  # fmt: skip
        assert r.status_code == 200 and r.json() == {"stored": True}, r.text
    r = await api.internal(
        run_id, "artifacts", worker_id="w1", kind="profile", step=12, uri="file:///p/12"
    )
    assert r.json() == {"stored": True}
    assert await count(api, Artifact, run_id) == 3
    # The worker dies; the run goes back to the queue; the next claim resumes from step 10.
    await api.internal(run_id, "status", worker_id="w1", status="running")

    async def expire(session: Any) -> None:
        run = await session.get(Run, run_id)
        run.lease_expires_at = utcnow() - timedelta(seconds=1)

    await api.db(expire)
    assert await reap_once(api.state) == [run_id]
    claim = await api.internal(run_id, "claim", worker_id="w2")
    # With the attempt that wrote it: the policy the next attempt's first update is applied to.
    newest = {"step": 10, "uri": "file:///c/10", "size_bytes": 100, "attempt": 1}
    assert claim.json()["checkpoint"] == newest


async def test_a_first_claim_has_no_checkpoint(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    claim = await api.internal(run_id, "claim", worker_id="w1")
    assert claim.json()["checkpoint"] is None


INFLIGHT = {
    "step": 3,
    "trainer": "waiting_for_trajectories",
    "trainer_since_s": 1.5,
    "queue_depth": 2,
    "episodes": [{"episode_id": "e1", "stage": "env_step", "since_s": 0.2, "turn": 1}],
}


async def test_the_heartbeat_keeps_inflight_and_hands_out_a_profile_once(api: Api) -> None:
    auth, run_id = await claimed(api)
    assert (await api.client.get(f"/v1/runs/{run_id}/inflight", headers=auth)).json() == {
        "reported_at": None,
        "snapshot": None,
    }
    beat = await api.internal(run_id, "heartbeat", worker_id="w1", inflight=INFLIGHT)
    assert beat.status_code == 200, beat.text
    assert beat.json()["profile_steps"] is None
    got = (await api.client.get(f"/v1/runs/{run_id}/inflight", headers=auth)).json()
    assert got["snapshot"] == INFLIGHT and got["reported_at"] is not None

    r = await api.client.post(f"/v1/runs/{run_id}/profile", json={"steps": 5}, headers=auth)
    assert r.status_code == 202 and r.json() == {"requested_steps": 5}
    # Handed out once; a heartbeat without inflight keeps the last report.
    assert (await api.internal(run_id, "heartbeat", worker_id="w1")).json()["profile_steps"] == 5
    assert (await api.internal(run_id, "heartbeat", worker_id="w1")).json()["profile_steps"] is None
    got = (await api.client.get(f"/v1/runs/{run_id}/inflight", headers=auth)).json()
    assert got["snapshot"] == INFLIGHT


@pytest.mark.parametrize("steps", [0, 101, "many"])
async def test_a_profile_outside_1_to_100_steps_is_422(api: Api, steps: Any) -> None:
    auth, run_id = await claimed(api)
    r = await api.client.post(f"/v1/runs/{run_id}/profile", json={"steps": steps}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "steps"


async def test_a_finished_run_cannot_be_profiled(api: Api) -> None:
    auth, run_id = await claimed(api)
    await api.internal(run_id, "status", worker_id="w1", status="failed", error="boom")
    r = await api.client.post(f"/v1/runs/{run_id}/profile", json={"steps": 2}, headers=auth)
    assert r.status_code == 409 and "failed" in r.json()["error"]["message"]


REPORTS: list[tuple[str, dict[str, Any]]] = [
    ("spans", {"seq": 0, "spans": [span(0)]}),
    ("trajectories", {"seq": 0, "trajectories": [trajectory("e")]}),
    ("artifacts", {"kind": "checkpoint", "step": 1, "uri": "file:///c"}),
]


@pytest.mark.parametrize(("action", "body"), REPORTS)
async def test_only_the_lease_owner_may_report(api: Api, action: str, body: dict[str, Any]) -> None:
    _, run_id = await claimed(api)
    r = await api.internal(run_id, action, worker_id="intruder", **body)
    assert r.status_code == 409 and r.json()["error"]["field"] == "worker_id"
    # A lease token opens its own run only, and learns nothing of others, not even whether
    # they exist.
    r = await api.internal(
        "run_missing", action, worker_id="w1", lease_token=api.leases[run_id], **body
    )
    assert r.status_code == 403 and "does not hold run run_missing" in r.json()["error"]["message"]
    r = await api.client.post(f"/internal/runs/{run_id}/{action}", json={"worker_id": "w1", **body})
    assert r.status_code == 401
    # A finished run holds no lease: its old worker can no longer report.
    await api.internal(run_id, "status", worker_id="w1", status="cancelled")
    r = await api.internal(run_id, action, worker_id="w1", **body)
    assert r.status_code == 403 and r.json()["error"]["field"] == "Authorization"
    assert await count(api, Span, run_id) == 0
    assert await count(api, Trajectory, run_id) == 0
    assert await count(api, Artifact, run_id) == 0


@pytest.mark.parametrize(
    ("action", "body", "field"),
    [
        ("spans", {"seq": 0, "spans": [span(0, dur_us=-1)]}, "spans.0.dur_us"),
        ("spans", {"seq": 0, "spans": [span(0, step=2**31)]}, "spans.0.step"),
        ("spans", {"seq": 0, "spans": [span(0, colour="red")]}, "spans.0.colour"),
        ("spans", {"seq": 0, "spans": [span(0, args={"x": [1]})]}, "spans.0.args.x.str"),
        ("trajectories", {"seq": 0, "trajectories": [trajectory("e", end_state="won")]},
         "trajectories.0.end_state"),
        ("trajectories", {"seq": 0, "trajectories": [trajectory("e", reward=float("inf"))]},
         "trajectories.0.reward"),
        ("artifacts", {"kind": "model", "step": 1, "uri": "file:///c"}, "kind"),
        ("artifacts", {"kind": "checkpoint", "step": 1, "uri": ""}, "uri"),
        ("metrics", {"seq": 0, "points": [{"step": 2**31, "name": "x", "value": 1}]},
         "points.0.step"),
        ("heartbeat", {"inflight": {**INFLIGHT, "queue_depth": -1}}, "inflight.queue_depth"),
    ],
)  # fmt: skip
async def test_bad_reports_are_422_naming_the_field(
    api: Api, action: str, body: dict[str, Any], field: str
) -> None:
    _, run_id = await claimed(api)
    r = await api.client.post(
        f"/internal/runs/{run_id}/{action}",
        content=json.dumps({"worker_id": "w1", **body}, allow_nan=True),
        headers={**lease(api.leases[run_id]), "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.json()


async def test_a_batch_that_fails_in_the_database_leaves_nothing_and_its_retry_is_stored(
    api: Api,
) -> None:
    """The seq row, the points and the run's step commit together or not at all."""
    _, run_id = await claimed(api)
    # A trigger makes the database refuse the batch after its first rows went in.
    await api.db(lambda s: s.execute(text(
        "CREATE FUNCTION refuse_boom() RETURNS trigger AS $$ BEGIN "
        "IF NEW.name = 'boom' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$ "
        "LANGUAGE plpgsql; "
        "CREATE TRIGGER refuse_boom BEFORE INSERT ON metric_points "
        "FOR EACH ROW EXECUTE FUNCTION refuse_boom()"
    )))  # fmt: skip
    points = [{"step": 7, "name": "fine", "value": 1.0}, {"step": 7, "name": "boom", "value": 2.0}]
    try:
        refused = await api.internal(run_id, "metrics", worker_id="w1", seq=4, points=points)
        # A 500 in the API's error shape, without the database's words (a worker retries it).
        assert refused.status_code == 500
        assert refused.json()["error"]["code"] == "internal"
        assert "refused" not in refused.text
    finally:
        await api.db(lambda s: s.execute(text(
            "DROP TRIGGER refuse_boom ON metric_points; DROP FUNCTION refuse_boom()"
        )))  # fmt: skip
    assert await count(api, MetricPoint, run_id) == 0
    assert await count(api, IngestBatch, run_id) == 0
    run = await api.db(lambda s: s.get(Run, run_id))
    assert run is not None and run.current_step == 0
    retry = await api.internal(run_id, "metrics", worker_id="w1", seq=4, points=points)
    assert retry.json() == {"accepted": 2, "duplicate": False}
    assert await count(api, MetricPoint, run_id) == 2
