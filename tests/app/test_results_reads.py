"""Public reads of a run's results on real Postgres: timeline, trajectories, checkpoints, events."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.app.conftest import Api
from tests.app.test_results_ingest import claimed, span, trajectory

pytestmark = pytest.mark.anyio


async def test_the_timeline_is_chrome_trace_json_with_a_row_per_track(api: Api) -> None:
    auth, run_id = await claimed(api)
    spans = [
        span(0, name="rollout", track="episode/e1", start_us=100, dur_us=50, step=0),
        span(0, name="train_step", track="trainer", start_us=120, dur_us=30, step=1),
        span(0, name="model_call", track="episode/e1", start_us=110, dur_us=5, step=0,
             args={"turn": 1}),
        span(0, name="engine_batch", track="engine", start_us=111, dur_us=3, step=0),
    ]  # fmt: skip
    r = await api.internal(run_id, "spans", worker_id="w1", seq=0, spans=spans)
    assert r.status_code == 200
    trace = (await api.client.get(f"/v1/runs/{run_id}/timeline", headers=auth)).json()
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    # Fixed rows first (trainer, engine), then episodes.
    assert names == {1: "trainer", 2: "engine", 3: "episode/e1"}
    assert all(e["ph"] == "M" and e["pid"] == 1 for e in events if e["ph"] != "X")
    complete = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in complete] == ["rollout", "model_call", "engine_batch", "train_step"]
    call = complete[1]
    assert call == {
        "name": "model_call", "cat": "stage", "ph": "X", "ts": 110, "dur": 5, "pid": 1,
        "tid": 3, "args": {"step": 0, "turn": 1},
    }  # fmt: skip
    assert all("ts" not in e for e in events if e["ph"] == "M")  # no nulls for Perfetto
    assert trace["otherData"] == {"run_id": run_id, "truncated": False, "next_start_us": None}

    # A window: spans that start in [start_us, end_us); limit truncates and says where to go on.
    window = await api.client.get(
        f"/v1/runs/{run_id}/timeline",
        params={"start_us": 105, "end_us": 120, "limit": 1},
        headers=auth,
    )
    body = window.json()
    assert [e["name"] for e in body["traceEvents"] if e["ph"] == "X"] == ["model_call"]
    assert body["otherData"]["truncated"] is True and body["otherData"]["next_start_us"] == 111


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"start_us": 10, "end_us": 10}, 400, "end_us"),
        ({"start_us": 10, "end_us": 5}, 400, "end_us"),
        ({"start_us": -1}, 422, "start_us"),
        ({"end_us": "soon"}, 422, "end_us"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": 100_001}, 422, "limit"),
    ],
)
async def test_a_bad_timeline_window_names_the_parameter(
    api: Api, params: dict[str, object], status: int, field: str
) -> None:
    auth, run_id = await claimed(api)
    r = await api.client.get(f"/v1/runs/{run_id}/timeline", params=params, headers=auth)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


async def test_trajectories_come_in_cursor_pages_and_filter_by_step(api: Api) -> None:
    auth, run_id = await claimed(api)
    batch = [trajectory(f"e{i}", step=i % 3, reward=float(i)) for i in range(7)]
    await api.internal(run_id, "trajectories", worker_id="w1", seq=0, trajectories=batch)
    seen: list[tuple[int, str]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, object] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = await api.client.get(f"/v1/runs/{run_id}/trajectories", params=params, headers=auth)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [(item["step"], item["episode_id"]) for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == sorted(seen, key=lambda s: s[0]) and len(seen) == 7
    assert [e for s, e in seen if s == 0] == ["e0", "e3", "e6"]  # arrival order within a step

    r = await api.client.get(f"/v1/runs/{run_id}/trajectories", params={"step": 1}, headers=auth)
    items = r.json()["items"]
    assert [i["episode_id"] for i in items] == ["e1", "e4"]
    first = items[0]
    assert isinstance(first["id"], int)
    assert first["segments"] == batch[1]["segments"] and first["reward"] == 1.0
    assert first["model_tokens"] == 12 and first["end_state"] == "done"
    assert first["policy_version"] == 0 and first["sampling"]["temperature"] == 1.0


async def test_an_episode_no_step_trained_reads_untrained_whatever_was_stored(
    api: Api,
) -> None:
    """A worker before the rule stored a failed episode's model text as trained (its loss
    mask); the read says what reached the trainer: nothing of it."""
    auth, run_id = await claimed(api)
    batch = [
        trajectory("ok"),
        trajectory("broken", step=0, end_state="env_error", end_reason="env_step"),
        trajectory("given-up", step=0, end_state="cancelled", end_reason="client_cancelled"),
    ]
    await api.internal(run_id, "trajectories", worker_id="w1", seq=0, trajectories=batch)
    r = await api.client.get(f"/v1/runs/{run_id}/trajectories", headers=auth)
    read = {i["episode_id"]: i for i in r.json()["items"]}
    assert [s["trained"] for s in read["ok"]["segments"]] == [False, True]
    for failed in ("broken", "given-up"):
        assert [s["trained"] for s in read[failed]["segments"]] == [False, False]
        assert [s["text"] for s in read[failed]["segments"]] == ["hi", " 42"]  # still there


@pytest.mark.parametrize("cursor", ["nonsense", "WzEsICJ4Il0=", "bnVsbA=="])
async def test_a_bad_trajectory_cursor_is_400(api: Api, cursor: str) -> None:
    auth, run_id = await claimed(api)
    r = await api.client.get(
        f"/v1/runs/{run_id}/trajectories", params={"cursor": cursor}, headers=auth
    )
    assert r.status_code == 400 and r.json()["error"]["field"] == "cursor"


async def test_checkpoints_are_listed_oldest_first_without_other_artifacts(api: Api) -> None:
    auth, run_id = await claimed(api)
    assert (await api.client.get(f"/v1/runs/{run_id}/checkpoints", headers=auth)).json() == {
        "items": []
    }
    for kind, step in (("checkpoint", 20), ("profile", 5), ("checkpoint", 10)):
        await api.internal(
            run_id, "artifacts", worker_id="w1", kind=kind, step=step, uri=f"file:///{kind}/{step}"
        )
    items = (await api.client.get(f"/v1/runs/{run_id}/checkpoints", headers=auth)).json()["items"]
    assert [(i["step"], i["uri"], i["size_bytes"]) for i in items] == [
        (10, "file:///checkpoint/10", None),
        (20, "file:///checkpoint/20", None),
    ]
    assert all(datetime.fromisoformat(i["created_at"]).tzinfo is not None for i in items)


async def test_events_after_an_id_are_the_later_ones(api: Api) -> None:
    auth, run_id = await claimed(api)
    await api.internal(run_id, "status", worker_id="w1", status="running")
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert [e["to_status"] for e in events] == ["queued", "starting", "running"]
    ids = [e["id"] for e in events]
    assert ids == sorted(ids)
    later = await api.client.get(
        f"/v1/runs/{run_id}/events", params={"after": ids[0]}, headers=auth
    )
    assert [e["to_status"] for e in later.json()["items"]] == ["starting", "running"]
    none = await api.client.get(
        f"/v1/runs/{run_id}/events", params={"after": ids[-1]}, headers=auth
    )
    assert none.json()["items"] == []
    bad = await api.client.get(f"/v1/runs/{run_id}/events", params={"after": -1}, headers=auth)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "after"


@pytest.mark.parametrize(
    "path", ["timeline", "trajectories", "checkpoints", "inflight", "metrics/stream", "events"]
)
async def test_an_unknown_run_is_404(api: Api, path: str) -> None:
    auth = await api.tenant()
    r = await api.client.get(f"/v1/runs/run_missing/{path}", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["field"] == "run_id"
    r = await api.client.post("/v1/runs/run_missing/profile", json={"steps": 1}, headers=auth)
    assert r.status_code == 404
