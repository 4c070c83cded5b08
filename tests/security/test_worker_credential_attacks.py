"""Attacks on the worker API, /internal/runs/{id}/..., with what a worker holds.

Each test is one attack, played over real HTTP on loopback against the control plane
on real PostgreSQL, with what an attacker can hold (tests/security/workers.py): the
shared worker token, the answer of its own claim, and other workers' ids. Each asserts
the refusal.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.workers import (
    SECRET,
    SHARED,
    call,
    claim,
    client,
    reap_at,
    run_scoped_calls,
    webhook_run,
)
from tests.web.live import LiveApi, live_api, migrated_database


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    # Loopback webhook URLs may be registered: the environment is never called here.
    with live_api(migrated_database(postgres_url), env_url_allowlist="loopback") as running:
        yield running


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


def test_an_expired_or_superseded_lease_token_is_refused(live: LiveApi) -> None:
    with client(live) as http:
        auth, run_id = webhook_run(http, live)
        first = claim(http, run_id, "w-first", lease_seconds=60)
        # The first worker went quiet; the reaper re-queues the run: its lease has expired.
        assert run_id in reap_at(live, 61)  # (and the other tests' runs: one database)
        expired = [
            (route, call(http, method, path, body, first.headers).status_code)
            for route, method, path, body in run_scoped_calls(run_id, first.worker_id)
        ]
        assert all(status == 403 for _, status in expired), expired
        # Another worker claims it: the first token stays refused, the new one works.
        second = claim(http, run_id, "w-second")
        assert second.claim["attempt"] == 2
        assert second.headers != first.headers
        for route, method, path, body in run_scoped_calls(run_id, second.worker_id):
            r = call(http, method, path, body, first.headers)
            assert r.status_code == 403, (route, r.text)
            assert f"does not hold run {run_id}" in r.json()["error"]["message"]
        beat = http.post(
            f"/internal/runs/{run_id}/heartbeat",
            json={"worker_id": second.worker_id},
            headers=second.headers,
        )
        assert beat.status_code == 200, beat.text
        run = http.get(f"/v1/runs/{run_id}", headers=auth).json()
        assert run["status"] == "starting" and run["current_step"] == 0
        assert http.get(f"/v1/runs/{run_id}/metrics", headers=auth).json()["points"] == []
        # A finished run's token ends with it.
        for status in ("running", "succeeded"):
            done = http.post(
                f"/internal/runs/{run_id}/status",
                json={"worker_id": second.worker_id, "status": status},
                headers=second.headers,
            )
            assert done.status_code == 200, done.text
        after = http.post(
            f"/internal/runs/{run_id}/heartbeat",
            json={"worker_id": second.worker_id},
            headers=second.headers,
        )
        assert after.status_code == 403, after.text


def test_the_shared_token_alone_cannot_report_to_a_run_or_read_its_secret(
    live: LiveApi,
) -> None:
    with client(live) as http:
        auth, run_id = webhook_run(http, live)
        holder = claim(http, run_id, "w-holder")
        # The secret goes to the lease holder, in the claim's answer.
        assert holder.claim["environment"]["secret"] == SECRET
        # Every route that names a claimed run refuses the shared token, before reading a body.
        answers = [
            (route, call(http, method, path, body, SHARED))
            for route, method, path, body in run_scoped_calls(run_id, holder.worker_id)
        ]
        for route, r in answers:
            assert r.status_code == 403, (route, r.text)
            error = r.json()["error"]
            assert error["field"] == "Authorization", route
            assert "the worker token opens only claims" in error["message"], route
            assert SECRET not in r.text
        # The claim, which the shared token does open, answers only for a queued run.
        again = http.post(
            f"/internal/runs/{run_id}/claim", json={"worker_id": "w-thief"}, headers=SHARED
        )
        assert again.status_code == 409 and SECRET not in again.text
        run = http.get(f"/v1/runs/{run_id}", headers=auth).json()
        assert run["status"] == "starting" and run["attempts"] == 1


def test_every_worker_route_but_the_claim_is_run_scoped(live: LiveApi) -> None:
    """The calls the tests above make reach every /internal route there is, the claim and
    the worker's report aside: a route added later is in their list (and refused as they
    are), or this fails."""
    with client(live) as http:
        paths = http.get("/openapi.json").json()["paths"]
    routes = {
        (method.upper(), path)
        for path, operations in paths.items()
        if path.startswith("/internal/")
        for method in operations
    }
    called = [(method, path.split("?")[0]) for _, method, path, _ in run_scoped_calls("r", "w")]

    def is_called(method: str, template: str) -> bool:
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", template)
        return any(m == method and re.fullmatch(pattern, path) for m, path in called)

    # Besides the claim, the shared token opens a worker's report of itself (its sandbox
    # wall, listed on /readyz) and a Tinker model worker's registration (its URL, withdrawn
    # only by the credential that made it: tests/app/test_tinker_refusals.py); neither names
    # a run or answers anything of one. The serving routes open to a serving order's secret
    # alone (the test below).
    serving = {(method, path) for method, path, _ in serving_calls("{server_id}")}
    assert {route for route in routes if not is_called(*route)} - serving == {
        ("POST", "/internal/runs/{run_id}/claim"),
        ("POST", "/internal/workers/report"),
        ("POST", "/internal/tinker/workers"),
        ("DELETE", "/internal/tinker/workers/{worker_id}"),
    }
    assert serving <= routes
    assert len(called) == len(routes) - 4 - len(serving)


def serving_calls(server_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """One well-formed call to each route of a served checkpoint's server (worker/serving.py)."""
    path = f"/internal/serving/{server_id}"
    return [
        ("GET", path, {}),
        ("POST", path, {"url": "http://attacker.example"}),
        ("POST", f"{path}/failed", {"error": "sabotaged"}),
        ("DELETE", path, {}),
    ]


def test_a_worker_credential_is_no_serving_orders_secret(live: LiveApi) -> None:
    """A served checkpoint's routes answer its order's secret only: a worker's claim token,
    or the shared token that claims, is refused there like any wrong secret (a live order's
    wrong secret: 401, tests/app/test_serving.py), so it registers no URL that the API
    would proxy a tenant's calls to."""
    with client(live) as http:
        _, run_id = webhook_run(http, live)
        held = claim(http, run_id, "w-serving")
        for headers in (held.headers, SHARED):
            for method, path, body in serving_calls("srv_0"):
                r = http.request(method, path, json=body or None, headers=headers)
                assert r.status_code in (401, 404), (method, path, r.status_code, r.text)
