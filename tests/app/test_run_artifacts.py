"""A tenant frees its storage: a run is refused while the tenant's stored artifacts are
at their quota, naming how to free some, and deleting a finished run's artifacts removes
its files from the store (another run's stay), its checkpoints from the listings, and its
bytes from the quota; a live run's, or another tenant's, are not deleted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rl_core.store import open_store
from tests.app.conftest import Api, running_api, set_quota

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(app_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    store = f"file://{tmp_path / 'store'}"
    async with running_api(
        app_database, artifact_store=store, artifacts_path=tmp_path / "artifacts"
    ) as running:
        yield running


async def checkpointed(api: Api, auth: dict[str, str], stored_bytes: int) -> str:
    """A running run whose worker reported a checkpoint and the bytes its run keeps."""
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.internal(run_id, "status", worker_id="w1", status="running")
    r = await api.internal(
        run_id,
        "artifacts",
        worker_id="w1",
        kind="checkpoint",
        step=2,
        uri=f"{api.state.settings.artifact_store}/{run_id}/checkpoints/step-00000002",
        stored_bytes=stored_bytes,
    )
    assert r.status_code == 200, r.text
    return run_id


async def test_a_full_quota_refuses_runs_until_a_finished_runs_artifacts_are_deleted(
    api: Api, tmp_path: Path
) -> None:
    store = open_store(api.state.settings.artifact_store)
    auth = await api.tenant()
    run_id = await checkpointed(api, auth, stored_bytes=5_000)
    other = await checkpointed(api, auth, stored_bytes=0)
    for run, name in ((run_id, "checkpoints/step-00000002/state"), (run_id, "exports/x")):
        store.put_bytes(f"{run}/{name}", b"x" * 100)
    store.put_bytes(f"{other}/checkpoints/step-00000002/state", b"kept")
    local = api.state.settings.artifacts_dir() / run_id
    local.mkdir(parents=True)
    (local / "cache").write_bytes(b"x")

    await set_quota(api, auth, artifact_bytes=4_000, runs_in_flight=10)
    r = await api.client.post(
        "/v1/runs", json={"spec": {"environment": {"name": "guess_number"}}}, headers=auth
    )
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["field"] == "quota.artifact_bytes"
    assert "DELETE /v1/runs/{id}/artifacts" in error["message"]
    assert error["quota"] == {"name": "artifact_bytes", "limit": 4_000, "used": 5_000}

    r = await api.client.delete(f"/v1/runs/{run_id}/artifacts", headers=auth)
    assert r.status_code == 409 and "cancel it" in r.json()["error"]["message"]  # still live
    await api.internal(run_id, "status", worker_id="w1", status="succeeded")
    stranger = await api.tenant()
    r = await api.client.delete(f"/v1/runs/{run_id}/artifacts", headers=stranger)
    assert r.status_code == 404
    assert [o.key for o in store.list(run_id)]  # untouched by the refusals

    r = await api.client.delete(f"/v1/runs/{run_id}/artifacts", headers=auth)
    assert r.status_code == 200, r.text
    assert r.json() == {"run_id": run_id, "freed_bytes": 5_000, "checkpoints": 1}
    assert store.list(run_id) == [] and not local.exists()
    assert [o.key for o in store.list(other)] == [f"{other}/checkpoints/step-00000002/state"]
    r = await api.client.get(f"/v1/runs/{run_id}/checkpoints", headers=auth)
    assert r.json()["items"] == []
    r = await api.client.get(f"/v1/runs/{run_id}", headers=auth)
    assert r.json()["status"] == "succeeded"  # the run itself stays
    limits = (await api.client.get("/v1/limits", headers=auth)).json()
    assert limits["usage"]["artifact_bytes"] == 0
    r = await api.client.post(
        "/v1/runs", json={"spec": {"environment": {"name": "guess_number"}}}, headers=auth
    )
    assert r.status_code == 201, r.text
