"""A credential per worker, on real Postgres: issued, hashed, claiming, revoked; and the
shared worker token, refused unless the operator keeps it on (then warned about)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import psycopg
import pytest

from app.db.models import Run, WorkerCredential
from app.main import reap_once
from app.security import WORKER_CREDENTIAL_PREFIX
from app.services import worker_credentials, workers
from tests.app.conftest import WORKER_TOKEN, Api, lease, plain, running_api

pytestmark = pytest.mark.anyio


async def issue(api: Api, name: str) -> tuple[str, dict[str, str]]:
    """A credential issued as `rlaas workers issue` does; returns (its id, its header)."""
    row, credential = await api.db(lambda s: worker_credentials.issue(s, name))
    assert credential.startswith("rlaas_worker_")
    return row.id, {"Authorization": f"Bearer {credential}"}


async def claim(api: Api, run_id: str, headers: dict[str, str], worker: str) -> Any:
    return await api.client.post(
        f"/internal/runs/{run_id}/claim", json={"worker_id": worker}, headers=headers
    )


async def test_an_issued_credential_claims_and_the_database_keeps_only_its_hash(
    api: Api, app_database: str
) -> None:
    cred_id, headers = await issue(api, "gpu-1")
    secret = headers["Authorization"].removeprefix("Bearer ")
    run_id = await api.submit(await api.tenant())
    r = await claim(api, run_id, headers, "gpu-1-123")
    assert r.status_code == 200, r.text
    run = await api.db(lambda s: s.get(Run, run_id))
    assert run is not None and run.lease_credential_id == cred_id  # who holds it, by credential
    with psycopg.connect(plain(app_database)) as conn:
        stored = conn.execute(
            "SELECT secret_hash, last_used_at FROM worker_credentials WHERE id = %s", (cred_id,)
        ).fetchone()
        everything = str(conn.execute("SELECT * FROM worker_credentials").fetchall())
        reason = conn.execute(
            "SELECT reason FROM run_events WHERE run_id = %s AND to_status = 'starting'",
            (run_id,),
        ).fetchone()
    assert stored is not None and stored[0] == hashlib.sha256(secret.encode()).hexdigest()
    # The random part is what follows "rlaas_worker_<prefix>_" (it may hold "_" itself: a
    # split on the last "_" left one letter, found in the row's timestamps, once).
    random_part = secret.removeprefix(WORKER_CREDENTIAL_PREFIX).partition("_")[2]
    assert len(random_part) >= 40
    assert secret not in everything and random_part not in everything
    assert reason == (f"claimed by gpu-1-123, with worker credential {cred_id} (gpu-1)",)
    # last_used_at moved at the claim, and not again by a call within the minute.
    first_use = stored[1]
    assert first_use is not None
    assert (await claim(api, run_id, headers, "gpu-1-123")).status_code == 409
    row = await api.db(lambda s: s.get(WorkerCredential, cred_id))
    assert row is not None and row.last_used_at == first_use


async def test_a_revoked_credential_is_refused_at_once_and_the_others_go_on(api: Api) -> None:
    leaked_id, leaked = await issue(api, "leaky")
    _, other = await issue(api, "sound")
    tenant = await api.tenant()
    held, queued = await api.submit(tenant), await api.submit(tenant)
    r = await claim(api, held, leaked, "leaky-1")
    assert r.status_code == 200, r.text
    held_lease = lease(r.json()["lease_token"])

    revoked, ended = await api.db(lambda s: worker_credentials.revoke(s, leaked_id))
    assert revoked.revoked_at is not None and ended == [held]

    refused = await claim(api, queued, leaked, "leaky-1")
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert error["field"] == "Authorization"
    assert f"worker credential {leaked_id} (leaky) was revoked" in error["message"]
    # The leases it held end with it: its lease token opens nothing now ...
    beat = await api.client.post(
        f"/internal/runs/{held}/heartbeat", json={"worker_id": "leaky-1"}, headers=held_lease
    )
    assert beat.status_code == 403, beat.text
    # ... and the reaper queues the run again, for a worker still enrolled.
    assert held in await reap_once(api.state)
    for run_id in (queued, held):
        r = await claim(api, run_id, other, "sound-1")
        assert r.status_code == 200, r.text


async def test_the_shared_token_is_refused_unless_kept_on_then_warned_once(
    app_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    shared = {"Authorization": f"Bearer {WORKER_TOKEN}"}
    async with running_api(app_database, worker_token=WORKER_TOKEN) as api:  # server: off
        run_id = await api.submit(await api.tenant())
        r = await claim(api, run_id, shared, "old-worker")
        assert r.status_code == 401
        assert "RLAAS_ALLOW_SHARED_WORKER_TOKEN" in r.json()["error"]["message"]
        assert "rlaas workers issue" in r.json()["error"]["message"]

    caplog.set_level(logging.WARNING, logger="rlaas.api")
    async with running_api(
        app_database, worker_token=WORKER_TOKEN, allow_shared_worker_token=True
    ) as api:
        tenant = await api.tenant()
        for _ in range(3):
            run_id = await api.submit(tenant)
            r = await claim(api, run_id, shared, "old-worker")
            assert r.status_code == 200, r.text
        run = await api.db(lambda s: s.get(Run, run_id))
        assert run is not None and run.lease_credential_id is None  # the shared token's
    warnings = [
        rec.getMessage()
        for rec in caplog.records
        if rec.levelno == logging.WARNING and "used the shared worker token" in rec.getMessage()
    ]
    assert len(warnings) == 1, warnings  # rate-limited: not one per call
    assert "deprecated" in warnings[0] and "rlaas workers issue" in warnings[0]


def test_the_shared_token_notice_is_rate_limited_and_counts_the_uses_between(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    notice = worker_credentials.SharedTokenNotice(every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="rlaas.api")
    for t in (0.0, 1.0, 30.0, 61.0):
        now[0] = t
        notice.used()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "1 uses since" in messages[0] and "3 uses since" in messages[1]


async def test_a_revoke_waits_for_a_claim_in_flight_and_ends_its_lease(api: Api) -> None:
    """A claim holds its credential's row (FOR SHARE) from its check until it commits; a
    revoke, locking the row for update, runs after it and so sees the lease it took."""
    cred_id, headers = await issue(api, "racing")
    secret = headers["Authorization"].removeprefix("Bearer ")
    run_id = await api.submit(await api.tenant())
    async with api.state.sessions() as claiming:
        identity = await worker_credentials.authenticate(claiming, secret)
        await worker_credentials.hold(claiming, identity)  # what require_worker does
        revoking = asyncio.create_task(api.db(lambda s: worker_credentials.revoke(s, cred_id)))
        await asyncio.sleep(0.3)  # time enough to finish, were it not waiting on the claim
        assert not revoking.done()
        await workers.claim(
            claiming, run_id, "racing-1", 60.0, credential=identity, default_accelerator="cpu"
        )
        await claiming.commit()
    _, ended = await revoking
    assert ended == [run_id]
