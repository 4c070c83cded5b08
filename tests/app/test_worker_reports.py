"""Each worker's sandbox wall, as it reports it, on /readyz (to operators) and in the run's
claim event (to the tenant)."""

from __future__ import annotations

import httpx
import pytest

from tests.app.conftest import WORKER, Api, running_api

pytestmark = pytest.mark.anyio

BWRAP = {"wall": "bwrap", "tenant_code": "runs"}
WEAK = {"wall": "audit", "tenant_code": "runs_on_weak_wall"}


async def report(api: Api, worker_id: str, sandbox: dict[str, str]) -> httpx.Response:
    body = {"worker_id": worker_id, "queue": "cpu", "sandbox": sandbox}
    return await api.client.post("/internal/workers/report", json=body, headers=WORKER)


async def test_readyz_lists_each_workers_last_report(api: Api) -> None:
    assert (await report(api, "w-strong", BWRAP)).status_code == 200
    assert (await report(api, "w-weak", BWRAP)).status_code == 200
    assert (await report(api, "w-weak", WEAK)).status_code == 200  # its newest word counts
    workers = (await api.client.get("/readyz")).json()["workers"]
    walls = {w["worker_id"]: (w["sandbox_wall"], w["tenant_code"], w["queue"]) for w in workers}
    assert walls == {
        "w-strong": ("bwrap", "runs", "cpu"),
        "w-weak": ("audit", "runs_on_weak_wall", "cpu"),
    }


async def test_a_report_needs_the_worker_token_and_a_known_wall(api: Api) -> None:
    body = {"worker_id": "w", "queue": "cpu", "sandbox": BWRAP}
    assert (await api.client.post("/internal/workers/report", json=body)).status_code == 401
    odd = await report(api, "w", {"wall": "chroot", "tenant_code": "runs"})
    assert odd.status_code == 422 and "wall" in odd.text


async def test_the_claim_event_names_the_claimers_wall(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    claimed = await api.internal(run_id, "claim", worker_id="w-weak", sandbox=WEAK)
    assert claimed.status_code == 200, claimed.text
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    reason = events[-1]["reason"]
    assert reason.startswith("claimed by w-weak (sandbox wall: WEAK, audit only"), reason
    assert "not a wall between tenants" in reason
    workers = (await api.client.get("/readyz")).json()["workers"]
    assert [(w["worker_id"], w["tenant_code"]) for w in workers] == [
        ("w-weak", "runs_on_weak_wall")
    ]


async def test_only_operators_see_the_workers(app_database: str) -> None:
    async with running_api(app_database, metrics_token="scrape-me") as api:
        await report(api, "w-strong", BWRAP)
        assert (await api.client.get("/readyz")).json() == {"status": "ready"}
        token = {"Authorization": "Bearer scrape-me"}
        shown = (await api.client.get("/readyz", headers=token)).json()
        assert [w["worker_id"] for w in shown["workers"]] == ["w-strong"]
    async with running_api(app_database) as api:  # no token: loopback clients only
        transport = httpx.ASGITransport(app=api.app, client=("203.0.113.7", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://rlaas.test") as far:
            assert (await far.get("/readyz")).json() == {"status": "ready"}
