"""Attacks on the worker API, /internal/runs/{id}/..., with what a worker holds.

Each test is one attack, played over real HTTP on loopback against the control plane
on real PostgreSQL, with what an attacker can hold (tests/security/workers.py): the
shared worker token, the answer of its own claim, and other workers' ids. Each asserts
the refusal.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.workers import call, claim, client, run_scoped_calls, webhook_run
from tests.web.live import LiveApi, live_api, migrated_database


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    # Loopback webhook URLs may be registered: the environment is never called here.
    with live_api(migrated_database(postgres_url), env_url_allowlist="loopback") as running:
        yield running


@pytest.mark.xfail(
    strict=True, reason="before scoped credentials, a worker's credential opened every run"
)
def test_a_claim_token_used_on_another_run_is_refused(live: LiveApi) -> None:
    with client(live) as http:
        _, mine = webhook_run(http, live)
        victim_auth, theirs = webhook_run(http, live)
        attacker = claim(http, mine, "w-attacker")
        victim = claim(http, theirs, "w-victim")
        # Everything the victim's worker may do, done with the attacker's claim, in the
        # victim worker's name (which the victim's run events show).
        answers = [
            (route, call(http, method, path, body, attacker.headers))
            for route, method, path, body in run_scoped_calls(theirs, victim.worker_id)
        ]
        got = " ".join(f"{route}={r.status_code}" for route, r in answers)
        assert all(r.status_code == 403 for _, r in answers), got
        for _, r in answers:
            error = r.json()["error"]
            assert error["field"] == "Authorization"
            assert f"does not hold run {theirs}" in error["message"]
        # The victim's run is untouched, and its own worker goes on.
        run = http.get(f"/v1/runs/{theirs}", headers=victim_auth).json()
        assert run["status"] == "starting" and run["current_step"] == 0
        metrics = http.get(f"/v1/runs/{theirs}/metrics", headers=victim_auth).json()
        assert metrics["points"] == []
        beat = http.post(
            f"/internal/runs/{theirs}/heartbeat",
            json={"worker_id": victim.worker_id},
            headers=victim.headers,
        )
        assert beat.status_code == 200, beat.text
