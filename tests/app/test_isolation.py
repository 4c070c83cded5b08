"""Tenant isolation, as a matrix: each tenant's key against each other tenant's run.

Every route under /v1/runs/{run_id} is taken from the app itself, so a route
added later is in the matrix without anyone remembering to add it. Another
tenant's run answers 404 (never 403, never data); its owner gets an answer.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.api.sessions import ACTIONS
from rl_core.artifacts import export_dir
from tests.app.conftest import Api, running_api
from tests.app.test_results_ingest import span, trajectory

pytestmark = pytest.mark.anyio

# Bodies that pass validation, so the answer is decided by who owns the run.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/runs/{run_id}/cancel"): None,
    ("POST", "/v1/runs/{run_id}/profile"): {"steps": 1},
    ("POST", "/v1/runs/{run_id}/sessions"): {},
    # The run's shared OpenAI URL (one base URL for many sessions, named per call).
    ("POST", "/v1/runs/{run_id}/openai/chat/completions"): {
        "model": "session:s1",
        "messages": [{"role": "user", "content": "hi"}],
    },
    ("POST", "/v1/runs/{run_id}/openai/completions"): {"model": "session:s1", "prompt": "hi"},
    ("POST", "/v1/runs/{run_id}/openai/responses"): {"model": "session:s1", "input": "hi"},
    ("POST", "/v1/runs/{run_id}/openai/sessions/{name}/end"): {"reward": 1.0},
    ("POST", "/v1/runs/{run_id}/openai/sessions/{name}/cancel"): None,
    # A served checkpoint (app.api.serving): the owner's first call asks a worker (503).
    ("POST", "/v1/runs/{run_id}/chat/completions"): {
        "model": "latest",
        "messages": [{"role": "user", "content": "hi"}],
    },
}
# A session's own calls take the session's key, not a tenant's: with any tenant's key
# they answer 404, owner included (tests/app/test_sessions_proxy.py holds them to it).
SESSION_CALLS = {f"/v1/runs/{{run_id}}/sessions/{{sid}}/{action}" for action in ACTIONS}


@pytest.fixture
async def api(app_database: str, tmp_path: Path) -> AsyncIterator[Api]:
    # The artifacts folder the export route streams from: each run's checkpoint gets one.
    async with running_api(app_database, artifacts_path=tmp_path) as running:
        yield running


def run_routes(api: Api) -> list[tuple[str, str]]:
    """(method, path) of every route on a run, from the app's own OpenAPI document; the
    deletes last (the owner's deletes its run's artifacts, which the reads need)."""
    paths: dict[str, dict[str, Any]] = api.app.openapi()["paths"]
    routes = [
        (method.upper(), path)
        for path, operations in sorted(paths.items())
        if path.startswith("/v1/runs/{run_id}") and path not in SESSION_CALLS
        for method in sorted(operations)
    ]
    return sorted(routes, key=lambda route: route[0] == "DELETE")


async def finished_run_with_results(api: Api, auth: dict[str, str]) -> str:
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.internal(run_id, "status", worker_id="w1", status="running")
    await api.internal(
        run_id, "metrics", worker_id="w1", seq=0, points=[{"step": 1, "name": "x", "value": 1}]
    )
    await api.internal(run_id, "spans", worker_id="w1", seq=0, spans=[span(0)])
    await api.internal(
        run_id, "trajectories", worker_id="w1", seq=0, trajectories=[trajectory("e")]
    )
    await api.internal(
        run_id, "artifacts", worker_id="w1", kind="checkpoint", step=1, uri="file:///c"
    )
    folder = export_dir(api.state.settings.artifacts_dir() / run_id, 1, "hf")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    tensorboard = api.state.settings.artifacts_dir() / run_id / "trackers" / "tensorboard"
    tensorboard.mkdir(parents=True)
    (tensorboard / "events.out.tfevents.1.w1").write_bytes(b"\0")
    # Finished, so its metrics stream ends and the owner's read of it returns.
    await api.internal(run_id, "status", worker_id="w1", status="succeeded")
    return run_id


async def call(api: Api, method: str, path: str, run_id: str, auth: dict[str, str]) -> Any:
    url = path.replace("{run_id}", run_id).replace("{name}", "s1").replace("{step}", "1")
    if method == "GET":
        return await api.client.get(url, headers=auth)
    if method == "DELETE":
        return await api.client.delete(url, headers=auth)
    if (method, path) not in BODIES:
        raise AssertionError(f"add a valid body for {method} {path} to BODIES")
    return await api.client.request(method, url, json=BODIES[method, path], headers=auth)


async def test_every_run_route_hides_other_tenants_runs(api: Api) -> None:
    keys = [await api.tenant(f"tenant-{i}") for i in range(3)]
    runs = [await finished_run_with_results(api, key) for key in keys]
    routes = run_routes(api)
    covered = {path for _, path in routes}
    for expected in ("timeline", "trajectories", "checkpoints", "inflight", "metrics/stream"):
        assert f"/v1/runs/{{run_id}}/{expected}" in covered
    for (method, path), (k, key), (r, run_id) in itertools.product(
        routes, enumerate(keys), enumerate(runs)
    ):
        response = await call(api, method, path, run_id, key)
        if k == r:
            assert response.status_code != 404, (method, path, response.text)
            continue
        assert response.status_code == 404, (method, path, response.status_code)
        error = response.json()["error"]
        assert error["code"] == "not_found" and run_id in error["message"]
        assert "tenant" not in response.text.lower()  # nothing about whose it is
