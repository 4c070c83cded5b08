"""Workers of the control plane over real HTTP on loopback, for attacks on /internal.

What an attacker of the worker API can hold: a worker's credential (``SHARED`` here:
an enrolled credential, which opens what the shared worker token opened, so the attacks
hold for both), the answer of a claim it made itself, and worker ids, which are not
secrets (``<hostname>-<pid>``, and every run's events say "claimed by <worker id>" to its
tenant).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from app.db.models import utcnow
from app.db.session import AsyncSession, make_engine
from app.services.leases import reap_expired_leases
from tests.web.live import WORKER_TOKEN, LiveApi

SHARED = {"Authorization": f"Bearer {WORKER_TOKEN}"}
SECRET = "tenant-webhook-secret-0123456789abcdef"


@dataclass
class Held:
    """What a worker holds once its claim is answered."""

    run_id: str
    worker_id: str
    claim: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def held_after(run_id: str, worker_id: str, claim: httpx.Response) -> Held:
    """The claim's answer and its lease token, the credential of the run's other routes."""
    assert claim.status_code == 200, claim.text
    body = claim.json()
    return Held(run_id, worker_id, body, {"Authorization": f"Bearer {body['lease_token']}"})


def client(live: LiveApi) -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=30)


def webhook_run(http: httpx.Client, live: LiveApi) -> tuple[dict[str, str], str]:
    """A new tenant's queued run on its own webhook environment (whose secret is SECRET)."""
    auth = {"Authorization": f"Bearer {live.tenant()}"}
    env = http.post(
        "/v1/environments",
        json={"name": "mine", "url": "http://127.0.0.1:9/env", "secret": SECRET},
        headers=auth,
    )
    assert env.status_code == 201, env.text
    spec = {"environment": {"name": env.json()["id"]}, "train": {"steps": 3}}
    run = http.post("/v1/runs", json={"spec": spec}, headers=auth)
    assert run.status_code == 201, run.text
    return auth, str(run.json()["id"])


def claim(http: httpx.Client, run_id: str, worker_id: str, lease_seconds: float = 60) -> Held:
    answer = http.post(
        f"/internal/runs/{run_id}/claim",
        json={"worker_id": worker_id, "lease_seconds": lease_seconds},
        headers=SHARED,
    )
    return held_after(run_id, worker_id, answer)


def run_scoped_calls(run_id: str, worker_id: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """One well-formed call to every run-scoped worker route: (route, method, path, body); the
    status report last, as it ends the run."""
    base = f"/internal/runs/{run_id}"
    w = {"worker_id": worker_id}
    point = {"step": 9, "name": "x", "value": 1}
    checkpoint = {"kind": "checkpoint", "step": 9, "uri": "file:///elsewhere"}
    gateway = {"url": "http://attacker.example", "token": "t" * 16}
    span = {"name": "train_step", "start_us": 0, "dur_us": 5, "track": "trainer", "step": 1}
    return [
        ("heartbeat", "POST", f"{base}/heartbeat", w),
        ("metrics", "POST", f"{base}/metrics", {**w, "seq": 7, "points": [point]}),
        ("spans", "POST", f"{base}/spans", {**w, "seq": 7, "spans": [span]}),
        ("trajectories", "POST", f"{base}/trajectories", {**w, "seq": 7, "trajectories": []}),
        ("artifacts", "POST", f"{base}/artifacts", {**w, **checkpoint}),
        ("gateway", "POST", f"{base}/gateway", {**w, **gateway}),
        ("env-callbacks", "GET", f"{base}/env-callbacks/{run_id}~a1-g0-e0/1?wait_s=0", {}),
        ("datasets", "GET", f"{base}/datasets/{'0' * 64}", {}),
        ("init-adapter", "GET", f"{base}/init-adapter", {}),
        ("status", "POST", f"{base}/status", {**w, "status": "failed", "error": "sabotaged"}),
    ]  # fmt: skip


def call(
    http: httpx.Client, method: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> httpx.Response:
    if method == "GET":
        return http.get(path, headers=headers)
    return http.post(path, json=body, headers=headers)


def reap_at(live: LiveApi, seconds_from_now: float) -> list[str]:
    """One pass of the lease reaper as if the clock read now + ``seconds_from_now``."""

    async def reap() -> list[str]:
        engine = make_engine(live.settings.database_url)
        try:
            async with AsyncSession(engine) as session:
                now = utcnow() + timedelta(seconds=seconds_from_now)
                requeued = await reap_expired_leases(session, now)
                await session.commit()
                return requeued
        finally:
            await engine.dispose()

    return asyncio.run(reap())
