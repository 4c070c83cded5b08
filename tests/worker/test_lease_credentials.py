"""The worker's credentials against the real control plane (uvicorn on loopback, real
PostgreSQL): it claims with the shared worker token, reports with the claim's lease token,
and stops cleanly when its lease is taken over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.security.workers import reap_at
from tests.web.live import WORKER_TOKEN, LiveApi, live_api, migrated_database
from worker.api_client import ControlPlane, LeaseLost
from worker.heartbeat import Heartbeater


@pytest.fixture(scope="module")
def live(postgres_url: str) -> Iterator[LiveApi]:
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def queued_run(live: LiveApi, auth: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    auth = auth or {"Authorization": f"Bearer {live.tenant()}"}
    spec = {"environment": {"name": "guess_number"}, "train": {"steps": 3}}
    r = httpx.post(f"{live.url}/v1/runs", json={"spec": spec}, headers=auth, timeout=30)
    assert r.status_code == 201, r.text
    return auth, str(r.json()["id"])


def worker(live: LiveApi, worker_id: str) -> ControlPlane:
    return ControlPlane(live.url, WORKER_TOKEN, worker_id, retry_seconds=0.0)


def test_a_worker_reports_with_its_claims_token_and_not_the_shared_one(live: LiveApi) -> None:
    auth, run_id = queued_run(live)
    claimer = worker(live, "w1")
    claim = claimer.claim(run_id, lease_seconds=60)
    assert claim.lease_token not in repr(claim)  # never in a log line
    with closing(claimer.for_lease(claim)) as api:
        api.report_status(run_id, "running")
        assert api.heartbeat(run_id).cancel_requested is False
        assert (
            api.send_batch(run_id, "metrics", 0, [{"step": 1, "name": "x", "value": 0.5}]) is False
        )
        api.record_artifact(run_id, "checkpoint", {"step": 1, "uri": "file:///c/1"})
    # The claimer's own client holds only the shared token: the run's routes refuse it.
    with pytest.raises(LeaseLost, match="the worker token opens only claims"):
        claimer.heartbeat(run_id)
    claimer.close()
    run = httpx.get(f"{live.url}/v1/runs/{run_id}", headers=auth, timeout=30).json()
    assert run["status"] == "running" and run["current_step"] == 1


def test_a_worker_whose_lease_was_taken_over_stops(live: LiveApi) -> None:
    _, run_id = queued_run(live)
    first = worker(live, "w-first")
    mine = first.claim(run_id, lease_seconds=60)
    first.close()
    # The first worker stalled past its lease; the reaper re-queued the run, another took it.
    assert run_id in reap_at(live, 61)
    second = worker(live, "w-second")
    theirs = second.claim(run_id, lease_seconds=60)
    second.close()
    with closing(first.for_lease(mine)) as api, pytest.raises(LeaseLost, match="does not hold run"):
        api.send_batch(run_id, "metrics", 0, [{"step": 1, "name": "x", "value": 0.5}])
    beats = Heartbeater(first.for_lease(mine), run_id, interval_s=0.05)
    with beats:
        assert beats.lease_lost.wait(30)
    assert beats.control.stop_requested
    with closing(second.for_lease(theirs)) as api:
        assert api.heartbeat(run_id).cancel_requested is False  # the new holder goes on


def test_each_beat_pushes_the_lease_by_the_workers_own_lease_seconds(live: LiveApi) -> None:
    """RLAAS_LEASE_SECONDS holds after the claim: the heartbeat thread asks for the worker's
    lease length (here 5 s against a 60 s claim), not the control plane's default of 60 s,
    so a killed worker's run is queued again that soon after its last beat."""
    _, run_id = queued_run(live)
    claimer = worker(live, "w-short-lease")
    claim = claimer.claim(run_id, lease_seconds=60)
    claimer.close()
    with closing(claimer.for_lease(claim)) as api:
        api.report_status(run_id, "running")
        before = datetime.now(UTC)
        ahead = api.heartbeat(run_id, lease_seconds=5).lease_expires_at - before
        assert timedelta(seconds=4) < ahead <= timedelta(seconds=6), ahead
    beats = Heartbeater(claimer.for_lease(claim), run_id, interval_s=0.05, lease_s=5)
    with beats:
        time.sleep(1)  # some twenty beats
    assert not beats.lease_lost.is_set()
    # The 60 s claim was cut to 5 s by the beats: 30 s on, the reaper takes the run back.
    assert run_id in reap_at(live, 30)


@pytest.fixture
def alone(postgres_url: str) -> Iterator[LiveApi]:
    """A live API on a database of its own: no other test's run is queued there."""
    with live_api(migrated_database(postgres_url)) as running:
        yield running


def test_the_workers_fair_claim_takes_the_run_fair_order_puts_first(alone: LiveApi) -> None:
    live = alone
    a, a_first = queued_run(live)
    _, a_second = queued_run(live, a)
    _, b_only = queued_run(live)
    taken = []
    # The messages come in the order the runs were sent: A's two, then B's.
    for number, message in enumerate((a_first, a_second, b_only)):
        claimer = worker(live, f"w-fair-{number}")
        claim = claimer.claim(message, lease_seconds=60, fair=True)
        claimer.close()
        with closing(claimer.for_lease(claim)) as api:
            api.report_status(claim.run_id, "running")  # the run taken, not the one named
        taken.append(claim.run_id)
    # A's second message took B's run: A had one going, B none.
    assert taken == [a_first, b_only, a_second]
