"""Public run API on real Postgres: auth, validation, pages, isolation, cancel, metrics."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from app.db.models import Run, RunEvent
from tests.app.conftest import Api, spec

pytestmark = pytest.mark.anyio


async def count(api: Api, model: type[Any]) -> int:
    return int(await api.db(lambda s: s.scalar(select(func.count()).select_from(model))) or 0)


async def test_missing_and_bad_keys_are_401_with_a_clear_message(api: Api) -> None:
    for headers in (
        {},
        {"Authorization": "Basic abc"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer rlaas_x_y"},
        {"Authorization": "Bearer nonsense"},
    ):
        r = await api.client.get("/v1/runs", headers=headers)
        assert r.status_code == 401, headers
        error = r.json()["error"]
        assert error["code"] == "unauthorized" and error["field"] == "Authorization"
        assert "Bearer" in error["message"] or "not valid" in error["message"]


async def test_a_good_key_with_a_wrong_secret_is_refused(api: Api) -> None:
    auth = await api.tenant()
    prefix = auth["Authorization"].removeprefix("Bearer ").split("_")[1]
    forged = {"Authorization": f"Bearer rlaas_{prefix}_not-the-secret"}
    assert (await api.client.get("/v1/runs", headers=forged)).status_code == 401
    assert (await api.client.get("/v1/runs", headers=auth)).status_code == 200


async def test_create_get_and_dispatch_after_commit(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/runs", json={"spec": spec(), "name": "first"}, headers=auth)
    assert r.status_code == 201, r.text
    run = r.json()
    assert set(run) == {
        "id", "name", "status", "spec", "accelerator", "attempts", "current_step", "error",
        "cancel_requested", "created_at", "updated_at", "started_at", "finished_at",
    }  # fmt: skip
    assert run["id"].startswith("run_") and len(run["id"]) == 4 + 32
    assert run["status"] == "queued" and run["name"] == "first" and run["attempts"] == 0
    assert run["spec"]["algorithm"]["name"] == "grpo"  # defaults filled in and stored
    assert api.dispatcher.sent == [run["id"]]
    got = (await api.client.get(f"/v1/runs/{run['id']}", headers=auth)).json()
    assert got == run
    events = (await api.client.get(f"/v1/runs/{run['id']}/events", headers=auth)).json()["items"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [(None, "queued")]


async def test_the_spec_name_is_the_default_run_name(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/runs", json={"spec": spec(name="from-spec")}, headers=auth)
    assert r.json()["name"] == "from-spec"


async def test_an_unknown_run_is_404(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.get("/v1/runs/run_nope", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (spec(algorithm={"learning_rate": -1}), "spec.algorithm.learning_rate", "greater than 0"),
        (spec(algorithm={"lr": 0.1}), "spec.algorithm.lr", "Extra inputs"),
        (spec(rollout={"group_size": "many"}), "spec.rollout.group_size", "valid integer"),
        ({"environment": {}}, "spec.environment.name", "Field required"),
        (spec(rollout={"vllm_url": "http://10.0.0.2:8000"}), "spec.rollout", "only used when"),
    ],
)
async def test_an_invalid_spec_names_the_field_and_writes_nothing(
    api: Api, body: dict[str, Any], field: str, reason: str
) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/runs", json={"spec": body}, headers=auth)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid" and error["field"] == field, error
    assert field in error["message"] and reason in error["message"], error
    assert await count(api, Run) == 0 and api.dispatcher.sent == []


async def test_unknown_top_level_fields_and_a_missing_spec_are_422(api: Api) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/runs", json={"spec": spec(), "colour": "red"}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "colour"
    r = await api.client.post("/v1/runs", json={"name": "x"}, headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "spec"


async def test_malformed_json_is_422_naming_the_body(api: Api) -> None:
    auth = {**(await api.tenant()), "Content-Type": "application/json"}
    r = await api.client.post("/v1/runs", content=b'{"spec": ', headers=auth)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["field"] == "body" and "not valid JSON" in error["message"], error
    assert await count(api, Run) == 0


async def test_list_pages_with_cursor_and_filters_by_status(api: Api) -> None:
    auth = await api.tenant()
    ids = [await api.submit(auth) for _ in range(5)]
    await api.client.post(f"/v1/runs/{ids[0]}/cancel", headers=auth)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await api.client.get("/v1/runs", params=params, headers=auth)).json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first, each exactly once
    r = await api.client.get("/v1/runs", params={"status": "cancelled"}, headers=auth)
    assert [item["id"] for item in r.json()["items"]] == [ids[0]]
    r = await api.client.get("/v1/runs", params={"status": "queued", "limit": 3}, headers=auth)
    assert [item["id"] for item in r.json()["items"]] == ids[:0:-1][:3]


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"cursor": "not-a-cursor"}, 400, "cursor"),
        ({"cursor": "WzFd"}, 400, "cursor"),  # base64 of "[1]": decodes, but is not ours
        ({"status": "sleeping"}, 400, "status"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": "ten"}, 422, "limit"),
    ],
)
async def test_bad_list_parameters_name_the_parameter(
    api: Api, params: dict[str, Any], status: int, field: str
) -> None:
    auth = await api.tenant()
    r = await api.client.get("/v1/runs", params=params, headers=auth)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == field


async def test_tenants_see_only_their_own_runs(api: Api) -> None:
    a, b = await api.tenant(), await api.tenant()
    run_a, run_b = await api.submit(a), await api.submit(b)
    for owner, other, run_id in ((a, b, run_a), (b, a, run_b)):
        for method, path in (
            ("GET", ""),
            ("POST", "/cancel"),
            ("GET", "/events"),
            ("GET", "/metrics"),
        ):
            r = await api.client.request(method, f"/v1/runs/{run_id}{path}", headers=other)
            assert r.status_code == 404, (method, path, r.text)
        owned = await api.client.get(f"/v1/runs/{run_id}", headers=owner)
        assert owned.status_code == 200 and owned.json()["status"] == "queued"  # not cancelled
    listed = (await api.client.get("/v1/runs", headers=a)).json()["items"]
    assert [item["id"] for item in listed] == [run_a]


async def test_cancel_a_queued_run_ends_it_and_a_second_cancel_is_409(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    r = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert r.status_code == 200
    assert r.json()["status"] == "cancelled" and r.json()["finished_at"] is not None
    again = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]
    events = await api.db(lambda s: s.scalars(select(RunEvent.to_status).order_by(RunEvent.id)))
    assert list(events) == ["queued", "cancelled"]
    # A cancelled run cannot be claimed.
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 409


async def test_metrics_filter_by_name_and_step_range_ordered_by_name_then_step(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    points = [{"step": s, "name": n, "value": s * 1.5} for s in (3, 1, 2, 4) for n in ("b", "a")]
    r = await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=points)
    assert r.json() == {"accepted": 8, "duplicate": False}

    async def query(**params: Any) -> list[tuple[str, int]]:
        r = await api.client.get(f"/v1/runs/{run_id}/metrics", params=params, headers=auth)
        assert r.status_code == 200 and r.json()["run_id"] == run_id
        return [(p["name"], p["step"]) for p in r.json()["points"]]

    assert await query() == [(n, s) for n in ("a", "b") for s in (1, 2, 3, 4)]
    assert await query(name="b", since_step=2) == [("b", 2), ("b", 3), ("b", 4)]
    assert await query(since_step=2, until_step=3) == [("a", 2), ("a", 3), ("b", 2), ("b", 3)]
    assert await query(name="missing") == []
    r = await api.client.get(f"/v1/runs/{run_id}/metrics?since_step=-1", headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "since_step"


async def test_a_nul_in_a_run_name_or_a_metric_name_is_a_422_not_a_500(api: Api) -> None:
    # Found by tests/app/test_fuzz_stateful.py: Postgres refuses NUL in a text column.
    auth = await api.tenant()
    for body, field in (
        ({"spec": spec(), "name": "a\x00"}, "name"),
        ({"spec": spec(name="a\x00")}, "spec.name"),
    ):
        r = await api.client.post("/v1/runs", json=body, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
    run_id = await api.submit(auth)
    r = await api.client.get(f"/v1/runs/{run_id}/metrics?name=a%00", headers=auth)
    assert r.status_code == 422 and r.json()["error"]["field"] == "name", r.text


async def test_a_metrics_step_bound_past_32_bits_is_a_422_not_a_500(api: Api) -> None:
    # Found by tests/app/test_fuzz_stateful.py: Postgres failed the query on the bound.
    auth = await api.tenant()
    run_id = await api.submit(auth)
    for field in ("since_step", "until_step"):
        url = f"/v1/runs/{run_id}/metrics"
        r = await api.client.get(url, params={field: 2**31}, headers=auth)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
        r = await api.client.get(url, params={field: 2**31 - 1}, headers=auth)
        assert r.status_code == 200 and r.json()["points"] == []


async def test_health_and_readiness(api: Api) -> None:
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    # The test client is a loopback client, so it is shown the workers' walls: none reported.
    assert (await api.client.get("/readyz")).json() == {"status": "ready", "workers": []}


async def test_openapi_documents_the_job_spec_and_the_routes(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert {"JobSpec", "AlgorithmSpec", "RunCreate", "RunRead"} <= set(schemas)
    assert schemas["RunCreate"]["properties"]["spec"] == {"$ref": "#/components/schemas/JobSpec"}
    assert {"/v1/runs", "/v1/runs/{run_id}", "/internal/runs/{run_id}/claim"} <= set(doc["paths"])


async def test_openapi_documents_the_200_of_a_replayed_create(api: Api) -> None:
    # Found by tests/app/test_fuzz_stateful.py: a replay (same Idempotency-Key, same body)
    # answers 200 with the run, which the document said only a 201 does.
    doc = (await api.client.get("/openapi.json")).json()
    answers = doc["paths"]["/v1/runs"]["post"]["responses"]
    for status in ("200", "201"):
        schema = answers[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/RunRead"}


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        # JSON as Python's parser takes it: Infinity and NaN are read as floats.
        ('{"algorithm": {"kl_coef": Infinity}}', "spec.algorithm.kl_coef", "finite number"),
        ('{"agent": {"max_episode_s": NaN}}', "spec.agent.max_episode_s", "finite number"),
        (
            '{"environment": {"name": "guess_number", "config": {"a": [1, NaN]}}}',
            "spec.environment.config",
            "config.a[1] is nan",
        ),
        (
            '{"agent": {"system_prompt": "' + "x" * 70_000 + '"}}',
            "spec.agent.system_prompt",
            "at most 65536 characters",
        ),
    ],
)
async def test_non_finite_numbers_and_oversized_text_are_refused_naming_the_field(
    api: Api, text: str, field: str, reason: str
) -> None:
    auth = {**(await api.tenant()), "Content-Type": "application/json"}
    body = (
        text
        if '"environment"' in text
        else text[:-1] + ', "environment": {"name": "guess_number"}}'
    )
    r = await api.client.post("/v1/runs", content=f'{{"spec": {body}}}'.encode(), headers=auth)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field and reason in error["message"], error
    assert await count(api, Run) == 0


@pytest.mark.parametrize(
    ("patch", "field", "reason"),
    [
        ({"model": {"source": "hf:/etc"}}, "spec.model.source", "relative to the operator's"),
        ({"model": {"source": "gguf:../../x.gguf"}}, "spec.model.source", "'..' are refused"),
        (
            {"rollout": {"engine": "vllm", "vllm_url": "http://169.254.169.254"}},
            "spec.rollout.vllm_url",
            "not accepted from tenants",
        ),
    ],
)
async def test_a_spec_may_not_point_a_shared_worker_at_its_files_or_addresses(
    api: Api, patch: dict[str, Any], field: str, reason: str
) -> None:
    auth = await api.tenant()
    r = await api.client.post("/v1/runs", json={"spec": spec(**patch)}, headers=auth)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field and reason in error["message"], error
    assert await count(api, Run) == 0 and api.dispatcher.sent == []
