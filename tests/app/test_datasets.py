"""Datasets on real Postgres: streamed upload, caps, tenant isolation, pinning, the worker's
download."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.conftest import Api, lease, running_api, set_quota

pytestmark = pytest.mark.anyio

NDJSON = {"Content-Type": "application/x-ndjson"}


def rows(n: int, *, start: int = 0) -> list[dict[str, Any]]:
    return [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(start, n)]


def jsonl(items: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in items)


async def chunked(data: bytes, size: int = 4096) -> AsyncIterator[bytes]:
    """A streamed body (no Content-Length), cut mid-line, as a large upload arrives."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture
async def dapi(app_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(
        app_database,
        data_dir=tmp_path,
        dataset_max_bytes=2_000_000,
        dataset_max_rows=100_000,
        quota_dataset_bytes=3_000_000,
    ) as running:
        yield running


def stored(tmp_path: Path) -> list[Path]:
    """Every file the data folder holds for datasets (temporary ones included)."""
    folder = tmp_path / "datasets"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


async def upload(
    api: Api, auth: dict[str, str], data: bytes, name: str = "sums", **params: Any
) -> httpx.Response:
    return await api.client.post(
        "/v1/datasets",
        params={"name": name, **params},
        content=chunked(data),
        headers={**auth, **NDJSON},
    )


async def test_upload_streamed_list_get_delete(dapi: Api, tmp_path: Path) -> None:
    auth = await dapi.tenant()
    # A day-old temporary file of an API process that died mid-upload: swept.
    stale = tmp_path / "datasets" / "tmp" / "dead.part"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))
    data = jsonl(rows(15_000))  # ~0.75 MB in 4 KiB chunks
    r = await upload(dapi, auth, data, required="question,answer")
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["id"].startswith("ds_") and ds["format"] == "jsonl"
    assert (ds["rows"], ds["size_bytes"], ds["fields"]) == (
        15_000,
        len(data),
        ["answer", "question"],
    )
    assert ds["sha256"] == hashlib.sha256(data).hexdigest()
    assert [p.name for p in stored(tmp_path)] == [f"{ds['sha256']}.jsonl"]  # no temporary left
    got = await dapi.client.get(f"/v1/datasets/{ds['id']}", headers=auth)
    assert got.status_code == 200 and got.json() == ds
    assert (await dapi.client.get("/v1/datasets", headers=auth)).json() == {"items": [ds]}
    gone = await dapi.client.delete(f"/v1/datasets/{ds['id']}", headers=auth)
    assert gone.status_code == 204
    again = await dapi.client.get(f"/v1/datasets/{ds['id']}", headers=auth)
    assert again.status_code == 404 and again.json()["error"]["field"] == "dataset_id"
    assert stored(tmp_path) == []


async def test_another_tenant_cannot_see_use_or_delete_it(dapi: Api) -> None:
    owner, other = await dapi.tenant(), await dapi.tenant()
    ds = (await upload(dapi, owner, jsonl(rows(10)))).json()
    for call in (dapi.client.get, dapi.client.delete):
        r = await call(f"/v1/datasets/{ds['id']}", headers=other)
        assert r.status_code == 404, r.text
    assert (await dapi.client.get("/v1/datasets", headers=other)).json() == {"items": []}
    env = {"name": "dataset", "config": {"dataset": ds["id"], "prompt": "question"}}
    r = await dapi.client.post(
        "/v1/runs", json={"spec": {"environment": env, "train": {"steps": 2}}}, headers=other
    )
    assert r.status_code == 422 and r.json()["error"]["field"] == "spec.environment.config.dataset"
    assert (await dapi.client.get(f"/v1/datasets/{ds['id']}", headers=owner)).status_code == 200


async def test_bad_json_on_line_1001_is_refused_naming_it_and_nothing_is_stored(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    lines = jsonl(rows(1000)) + b'{"question": "broken", "answer": \n' + jsonl(rows(5))
    r = await upload(dapi, auth, lines)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["line"] == 1001 and error["message"].startswith("line 1001: not valid JSON")
    assert stored(tmp_path) == []
    assert (await dapi.client.get("/v1/datasets", headers=auth)).json() == {"items": []}


async def test_a_missing_field_is_refused_naming_line_and_field(dapi: Api, tmp_path: Path) -> None:
    auth = await dapi.tenant()
    items = rows(50)
    del items[6]["answer"]
    r = await upload(dapi, auth, jsonl(items), required="question,answer")
    assert r.status_code == 422
    error = r.json()["error"]
    assert (error["line"], error["field"]) == (7, "answer"), error
    assert stored(tmp_path) == []


async def test_a_row_that_is_not_an_object_is_refused(dapi: Api) -> None:
    auth = await dapi.tenant()
    r = await upload(dapi, auth, jsonl(rows(2)) + b"[1, 2]\n")
    assert r.status_code == 422 and r.json()["error"]["line"] == 3
    assert "JSON object, not a list" in r.json()["error"]["message"]


async def test_over_the_size_cap_is_413_naming_it_and_nothing_is_stored(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    data = jsonl(rows(60_000))  # ~3 MB, over the 2 MB cap
    streamed = await upload(dapi, auth, data)
    assert streamed.status_code == 413, streamed.text
    assert streamed.json()["error"]["limit_bytes"] == 2_000_000
    assert "dataset_max_bytes" in streamed.json()["error"]["message"]
    # Declared up front: refused before a byte is read.
    declared = await dapi.client.post(
        "/v1/datasets", params={"name": "big"}, content=data, headers={**auth, **NDJSON}
    )
    assert declared.status_code == 413 and "dataset_max_bytes" in declared.text
    assert stored(tmp_path) == []
    assert (await dapi.client.get("/v1/datasets", headers=auth)).json() == {"items": []}


async def test_over_the_row_cap_and_the_tenant_quota_are_413(dapi: Api, tmp_path: Path) -> None:
    auth = await dapi.tenant()
    many = b'{"a":1}\n' * 100_001
    r = await upload(dapi, auth, many)
    assert r.status_code == 413 and r.json()["error"]["limit"] == "dataset_max_rows"
    first = await upload(dapi, auth, jsonl(rows(32_000)), name="a")  # ~1.7 MB of the 3 MB
    assert first.status_code == 201, first.text
    second = await upload(dapi, auth, jsonl(rows(32_001, start=1)), name="b")
    assert second.status_code == 413 and second.json()["error"]["quota"]["name"] == "dataset_bytes"
    assert [p.name for p in stored(tmp_path)] == [f"{first.json()['sha256']}.jsonl"]


async def test_a_tenants_own_dataset_quota_overrides_the_deployments(dapi: Api) -> None:
    raised, lowered = await dapi.tenant(), await dapi.tenant()
    await set_quota(dapi, raised, dataset_bytes=5_000_000)
    await set_quota(dapi, lowered, dataset_bytes=1_000_000)
    data = jsonl(rows(32_000))  # ~1.7 MB: over the lowered 1 MB, then twice within 5 MB
    refused = await upload(dapi, lowered, data)
    assert refused.status_code == 413
    quota = refused.json()["error"]["quota"]
    assert quota == {"name": "dataset_bytes", "limit": 1_000_000, "used": 0}
    for name in ("a", "b"):  # 3.4 MB: past the deployment's 3 MB, within this tenant's 5 MB
        assert (await upload(dapi, raised, data, name=name)).status_code == 201
    limits = (await dapi.client.get("/v1/limits", headers=raised)).json()
    assert limits["quotas"]["dataset_bytes"] == 5_000_000
    assert limits["usage"]["dataset_bytes"] == 2 * len(data)


async def test_a_run_pins_the_content_and_the_worker_downloads_exactly_that(
    dapi: Api, tmp_path: Path
) -> None:
    auth = await dapi.tenant()
    first = jsonl(rows(20))
    ds = (await upload(dapi, auth, first)).json()
    env = {
        "name": "dataset",
        "reward": "math",
        "config": {"dataset": ds["id"], "prompt": "Solve: {question}", "answer": "answer"},
    }
    run_id = await dapi.submit(auth, environment=env)
    # Replaced under the same name: same id, new content; the run keeps the first.
    second = jsonl(rows(30))
    replaced = await upload(dapi, auth, second)
    assert replaced.status_code == 200 and replaced.json()["id"] == ds["id"]
    assert replaced.json()["sha256"] == hashlib.sha256(second).hexdigest()
    run = (await dapi.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["spec"]["environment"]["config"]["sha256"] == ds["sha256"]
    # Deleting it while the run is queued: 409 naming the run.
    busy = await dapi.client.delete(f"/v1/datasets/{ds['id']}", headers=auth)
    assert busy.status_code == 409 and run_id in busy.json()["error"]["message"]
    claim = await dapi.internal(run_id, "claim", worker_id="w1", lease_seconds=30)
    assert claim.status_code == 200
    url = f"/internal/runs/{run_id}/datasets/{ds['sha256']}"
    got = await dapi.client.get(url, headers=lease(dapi.leases[run_id]))
    assert got.status_code == 200 and got.content == first
    # Only the content the run pinned, and only with its lease token.
    other = await dapi.client.get(
        f"/internal/runs/{run_id}/datasets/{replaced.json()['sha256']}",
        headers=lease(dapi.leases[run_id]),
    )
    assert other.status_code == 404
    assert (await dapi.client.get(url, headers=lease("not-the-lease"))).status_code == 403
    # The first content stays while the run is unfinished, and goes at the next upload after.
    names = {f"{ds['sha256']}.jsonl", f"{replaced.json()['sha256']}.jsonl"}
    assert {p.name for p in stored(tmp_path)} == names
    ended = await dapi.internal(run_id, "status", worker_id="w1", status="failed", error="x")
    assert ended.status_code == 200, ended.text
    later = (await upload(dapi, auth, jsonl(rows(3)), name="later")).json()
    names = {f"{replaced.json()['sha256']}.jsonl", f"{later['sha256']}.jsonl"}
    assert {p.name for p in stored(tmp_path)} == names


async def test_a_spec_naming_a_missing_field_or_a_server_key_is_422(dapi: Api) -> None:
    auth = await dapi.tenant()
    ds = (await upload(dapi, auth, jsonl(rows(5)))).json()

    async def submit(config: dict[str, Any]) -> dict[str, Any]:
        env = {"name": "dataset", "config": {"dataset": ds["id"], **config}}
        r = await dapi.client.post(
            "/v1/runs", json={"spec": {"environment": env, "train": {"steps": 2}}}, headers=auth
        )
        assert r.status_code == 422, r.text
        return dict(r.json()["error"])

    assert (await submit({"prompt": "question", "answer": "solution"}))["field"] == (
        "spec.environment.config.answer"
    )
    assert (await submit({"prompt": "Q: {query}"}))["field"] == "spec.environment.config.prompt"
    assert (await submit({"prompt": "question", "path": "/etc/passwd"}))["field"] == (
        "spec.environment.config.path"
    )
    assert (await submit({"prompt": "question", "shuffle": "maybe"}))["field"] == (
        "spec.environment.config.shuffle"
    )


async def test_a_procedural_source_is_checked_at_submit_and_pins_nothing(dapi: Api) -> None:
    auth = await dapi.tenant()

    async def submit(config: dict[str, Any]) -> httpx.Response:
        env = {"name": "dataset", "config": config}
        return await dapi.client.post(
            "/v1/runs", json={"spec": {"environment": env, "train": {"steps": 2}}}, headers=auth
        )

    good = {
        "dataset": "reasoning_gym:basic_arithmetic",
        "dataset_config": {"min_terms": 2, "max_terms": 2},
        "prompt": "Compute: {question}",
        "split": {"size": 50},
    }
    r = await submit(good)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["environment"]["config"] == good  # no content to pin
    unknown = await submit({**good, "dataset": "reasoning_gym:basic_arithmetc"})
    assert unknown.status_code == 422, unknown.text
    error = unknown.json()["error"]
    assert error["field"] == "spec.environment.config.dataset"
    assert "did you mean basic_arithmetic" in error["message"] and "chain_sum" in error["message"]
    lacking = await submit({**good, "prompt": "Solve {problem}"})
    assert lacking.status_code == 422
    assert lacking.json()["error"]["field"] == "spec.environment.config.prompt"
    assert "prompt, question" in lacking.json()["error"]["message"]
    shared = await submit({**good, "split": {"eval": 0.1}})  # a share of an unbounded source
    assert shared.json()["error"]["field"] == "spec.environment.config.split", shared.text


async def test_held_out_evaluation_needs_an_eval_split_and_k_needs_sampling(dapi: Api) -> None:
    auth = await dapi.tenant()
    config = {"dataset": "reasoning_gym:basic_arithmetic", "prompt": "{question}"}

    async def submit(config: dict[str, Any], **train: Any) -> httpx.Response:
        spec = {"environment": {"name": "dataset", "config": config}, "train": train}
        return await dapi.client.post("/v1/runs", json={"spec": spec}, headers=auth)

    unsplit = await submit(config, eval_interval=5)
    assert unsplit.status_code == 422, unsplit.text
    assert unsplit.json()["error"]["field"] == "spec.environment.config.split"
    greedy = await submit({**config, "split": {"size": 20}}, eval_interval=5, eval_k=4)
    assert greedy.status_code == 422, greedy.text
    assert "eval_temperature" in greedy.text and "eval_k" in greedy.text
    sampled = {"eval_interval": 5, "eval_k": 4, "eval_temperature": 0.8}
    r = await submit({**config, "split": {"size": 20}}, **sampled)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["train"]["eval_k"] == 4
