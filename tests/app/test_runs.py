"""Public run API on real Postgres: auth, validation, pages, idempotency, isolation, cancel."""

from __future__ import annotations

from sqlalchemy import func, select

from app.db.models import Run, RunEvent
from tests.app.conftest import Api, spec


def count(api: Api, model: type) -> int:
    return int(api.db(lambda s: s.scalar(select(func.count()).select_from(model))))


def test_missing_and_bad_keys_are_401_with_the_header_named(api: Api) -> None:
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer rlaas_x_y"},
        {"Authorization": "Bearer nonsense"},
    ):
        r = api.client.get("/v1/runs", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["field"] == "Authorization"


def test_create_get_and_dispatch_after_commit(api: Api) -> None:
    auth = api.tenant()
    r = api.client.post("/v1/runs", json={"spec": spec(), "name": "first"}, headers=auth)
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["name"] == "first" and run["attempts"] == 0
    assert run["spec"]["algorithm"]["name"] == "grpo"  # defaults filled in and stored
    assert api.dispatcher.sent == [run["id"]]
    got = api.client.get(f"/v1/runs/{run['id']}", headers=auth).json()
    assert got["id"] == run["id"] and got["status"] == "queued"
    events = api.client.get(f"/v1/runs/{run['id']}/events", headers=auth).json()["items"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [(None, "queued")]


def test_invalid_spec_names_the_field_and_writes_nothing(api: Api) -> None:
    auth = api.tenant()
    cases = [
        (spec(algorithm={"learning_rate": -1}), "spec.algorithm.learning_rate", "greater than 0"),
        (spec(algorithm={"lr": 0.1}), "spec.algorithm.lr", "Extra inputs"),
        (spec(rollout={"group_size": "many"}), "spec.rollout.group_size", "valid integer"),
        ({"environment": {}}, "spec.environment.name", "Field required"),
    ]
    for body, field, reason in cases:
        r = api.client.post("/v1/runs", json={"spec": body}, headers=auth)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["field"] == field, error
        assert reason in error["message"], error
    r = api.client.post("/v1/runs", json={"spec": spec(), "colour": "red"}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "colour"
    assert count(api, Run) == 0 and api.dispatcher.sent == []


def test_malformed_json_is_422(api: Api) -> None:
    auth = {**api.tenant(), "Content-Type": "application/json"}
    r = api.client.post("/v1/runs", content=b'{"spec": ', headers=auth)
    assert r.status_code == 422
    assert "JSON" in r.json()["error"]["message"]


def test_idempotency_key_returns_the_same_run_and_refuses_another_body(api: Api) -> None:
    auth = {**api.tenant(), "Idempotency-Key": "abc-1"}
    first = api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    again = api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = api.client.post("/v1/runs", json={"spec": spec(train={"steps": 9})}, headers=auth)
    assert other.status_code == 409 and other.json()["error"]["field"] == "Idempotency-Key"
    assert count(api, Run) == 1 and len(api.dispatcher.sent) == 1


def test_list_pages_with_cursor_and_filters_by_status(api: Api) -> None:
    auth = api.tenant()
    ids = [
        api.client.post("/v1/runs", json={"spec": spec()}, headers=auth).json()["id"]
        for _ in range(5)
    ]
    api.client.post(f"/v1/runs/{ids[0]}/cancel", headers=auth)
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = api.client.get("/v1/runs", params=params, headers=auth).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first, each exactly once
    cancelled = api.client.get("/v1/runs", params={"status": "cancelled"}, headers=auth).json()
    assert [item["id"] for item in cancelled["items"]] == [ids[0]]
    bad = api.client.get("/v1/runs", params={"cursor": "not-a-cursor"}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "cursor"
    bad = api.client.get("/v1/runs", params={"status": "sleeping"}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "status"


def test_tenants_see_only_their_own_runs(api: Api) -> None:
    a, b = api.tenant(), api.tenant()
    run_a = api.client.post("/v1/runs", json={"spec": spec()}, headers=a).json()["id"]
    run_b = api.client.post("/v1/runs", json={"spec": spec()}, headers=b).json()["id"]
    for owner, other, run_id in ((a, b, run_a), (b, a, run_b)):
        for method, path in (
            ("GET", ""),
            ("POST", "/cancel"),
            ("GET", "/events"),
            ("GET", "/metrics"),
        ):
            r = api.client.request(method, f"/v1/runs/{run_id}{path}", headers=other)
            assert r.status_code == 404, (method, path, r.text)
            assert run_id not in r.text.replace(f"no run '{run_id}'", "")
        assert api.client.get(f"/v1/runs/{run_id}", headers=owner).status_code == 200
    listed = api.client.get("/v1/runs", headers=a).json()["items"]
    assert [item["id"] for item in listed] == [run_a]


def test_cancel_queued_ends_it_and_a_second_cancel_is_409(api: Api) -> None:
    auth = api.tenant()
    run_id = api.client.post("/v1/runs", json={"spec": spec()}, headers=auth).json()["id"]
    r = api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    again = api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]
    events = api.db(lambda s: s.scalars(select(RunEvent.to_status).order_by(RunEvent.id)))
    assert list(events) == ["queued", "cancelled"]


def test_health_and_readiness(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"status": "ready"}
