"""The lease reaper: expired leases go back to the queue, a bounded number of times."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Run, Tenant, utcnow
from app.main import reap_once
from app.services.leases import fail_unclaimed_runs, reap_expired_leases, stranded_queued_runs
from tests.app.conftest import Api, running_api, spec

pytestmark = pytest.mark.anyio


async def reap_at(api: Api, seconds_from_now: float) -> list[str]:
    """One reaper pass as if the clock read now + ``seconds_from_now``."""
    now = utcnow() + timedelta(seconds=seconds_from_now)
    return await api.db(lambda s: reap_expired_leases(s, now))


async def test_a_live_lease_is_left_alone_and_an_expired_one_is_requeued(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1", lease_seconds=60)
    await api.internal(run_id, "status", worker_id="w1", status="running")
    assert await reap_at(api, 30) == []
    assert await reap_at(api, 61) == [run_id]
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "queued" and run["attempts"] == 1
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert (events[-1]["from_status"], events[-1]["to_status"]) == ("running", "queued")
    assert events[-1]["reason"] == "lease held by w1 expired"
    # The old worker lost its lease, and its token with it; the next one claims and resumes.
    old_token = api.leases[run_id]
    assert (await api.internal(run_id, "heartbeat", worker_id="w1")).status_code == 403
    claim = await api.internal(run_id, "claim", worker_id="w2")
    assert claim.status_code == 200 and claim.json()["attempt"] == 2
    assert claim.json()["lease_token"] != old_token


async def test_a_resumed_claim_carries_the_step_reached(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1")
    points = [{"step": 7, "name": "loss", "value": 0.5}]
    await api.internal(run_id, "metrics", worker_id="w1", seq=0, points=points)
    await reap_at(api, 3600)
    claim = await api.internal(run_id, "claim", worker_id="w2")
    assert claim.json()["resume_step"] == 7


async def test_attempts_are_bounded_then_the_run_fails(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    api.dispatcher.sent.clear()
    for attempt in range(1, 4):
        claim = await api.internal(run_id, "claim", worker_id=f"w{attempt}", lease_seconds=1)
        assert claim.json()["attempt"] == attempt
        assert await api.db(lambda s: reap_expired_leases(s, utcnow())) == []  # still live
        await api.db(lambda s: _expire(s, run_id))
        requeued = await reap_once(api.state)  # what the lifespan's loop calls
        run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
        if attempt < 3:
            assert requeued == [run_id] and run["status"] == "queued"
        else:
            assert requeued == [] and run["status"] == "failed"
            assert "crash loop: the worker died on 3 attempts in a row" in run["error"]
            assert run["finished_at"]
    assert api.dispatcher.sent == [run_id, run_id]  # dispatched again after each re-queue
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert events[-1]["reason"].startswith("crash loop: the worker died on 3 attempts")
    assert (await api.internal(run_id, "heartbeat", worker_id="w3")).status_code == 403


async def test_a_run_preempted_while_advancing_is_queued_again_after_a_backoff(
    app_database: str,
) -> None:
    """Four workers die, each after training further than the one before and none saving
    a checkpoint: a crash loop by the old rule, preemption by this one. Each goes back to
    the queue only once the backoff after its lease's end has passed."""
    async with running_api(app_database, requeue_backoff_s=30.0) as api:
        auth = await api.tenant()
        run_id = await api.submit(auth)
        for attempt in range(1, 5):
            claim = await api.internal(run_id, "claim", worker_id=f"w{attempt}", lease_seconds=1)
            assert claim.json()["attempt"] == attempt
            step = 2 * attempt
            update_ = {"step": step, "attempt": attempt, "base_step": step - 1,
                       "base_attempt": attempt, "optimizer_updates": step}  # fmt: skip
            answer = await api.internal(
                run_id,
                "metrics",
                worker_id=f"w{attempt}",
                seq=attempt * 1000,
                points=[{"step": step, "name": "loss", "value": 0.5}],
                updates=[update_],
            )
            assert answer.status_code == 200, answer.text
            await api.db(lambda s: _expire(s, run_id))  # expired 1 s ago
            assert await reap_with_policy(api, 0) == []
            run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
            assert run["status"] in ("starting", "running")  # backing off, lease expired
            assert await reap_with_policy(api, 30) == [run_id]
        run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
        assert run["status"] == "queued" and run["attempts"] == 4


async def reap_with_policy(api: Api, seconds_from_now: float) -> list[str]:
    """One pass with the deployment's policy (its backoff), at now + ``seconds_from_now``."""
    now = utcnow() + timedelta(seconds=seconds_from_now)
    policy = api.state.settings.requeue_policy()
    return await api.db(lambda s: reap_expired_leases(s, now, policy=policy))


async def _expire(session: AsyncSession, run_id: str) -> None:
    past = utcnow() - timedelta(seconds=1)
    await session.execute(update(Run).where(Run.id == run_id).values(lease_expires_at=past))


async def test_a_dead_worker_of_a_cancelled_run_ends_the_run(api: Api) -> None:
    auth = await api.tenant()
    run_id = await api.submit(auth)
    await api.internal(run_id, "claim", worker_id="w1")
    await api.client.post(f"/v1/runs/{run_id}/cancel", headers=auth)
    assert await reap_at(api, 3600) == []  # nothing to dispatch: the owner wanted it stopped
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "cancelled"


async def test_queued_and_finished_runs_are_not_reaped(api: Api) -> None:
    auth = await api.tenant()
    queued = await api.submit(auth)
    done = await api.submit(auth)
    await api.internal(done, "claim", worker_id="w1")
    await api.internal(done, "status", worker_id="w1", status="running")
    await api.internal(done, "status", worker_id="w1", status="succeeded")
    assert await reap_at(api, 10_000) == []
    for run_id, status in ((queued, "queued"), (done, "succeeded")):
        assert (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()["status"] == status


async def test_the_lifespan_runs_the_reaper_on_its_interval(app_database: str) -> None:
    async with running_api(app_database, reaper_interval_s=0.1) as api:
        auth = await api.tenant()
        run_id = await api.submit(auth)
        await api.internal(run_id, "claim", worker_id="w1", lease_seconds=0.2)
        for _ in range(100):
            if api.dispatcher.sent == [run_id, run_id]:
                break
            await asyncio.sleep(0.05)
        assert api.dispatcher.sent == [run_id, run_id]
        run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
        assert run["status"] == "queued"
    # Leaving the block shut the lifespan down: the reaper task was cancelled without error.


async def test_a_run_whose_dispatch_was_lost_is_sent_again(api: Api) -> None:
    """The broker was down (or lost the message) when the run was created: it would stay
    queued forever. The reaper sends a run queued for longer than redispatch_after_s
    again, then waits as long before the next time."""
    auth = await api.tenant()
    stranded, fresh = await api.submit(auth), await api.submit(auth)
    api.dispatcher.sent.clear()
    late = utcnow() - timedelta(seconds=api.state.settings.redispatch_after_s + 1)
    await api.db(lambda s: s.execute(update(Run).where(Run.id == stranded).values(updated_at=late)))
    await reap_once(api.state)
    assert api.dispatcher.sent == [stranded]
    await reap_once(api.state)
    assert api.dispatcher.sent == [stranded]  # not again until another interval has passed
    # Once claimed it is no longer queued: never sent again.
    await api.internal(stranded, "claim", worker_id="w1")
    await api.db(lambda s: s.execute(update(Run).where(Run.id == stranded).values(updated_at=late)))
    await reap_once(api.state)
    assert api.dispatcher.sent == [stranded] and fresh not in api.dispatcher.sent


async def test_a_run_that_saves_checkpoints_survives_any_number_of_preemptions(api: Api) -> None:
    """Five workers die in turn, each after saving a checkpoint: the run is queued again
    each time (its attempts advance it); then three die without one and it fails."""
    auth = await api.tenant()
    run_id = await api.submit(auth)
    for attempt in range(1, 9):
        await api.internal(run_id, "claim", worker_id=f"w{attempt}", lease_seconds=1)
        if attempt <= 5:
            r = await api.internal(
                run_id, "artifacts", worker_id=f"w{attempt}", kind="checkpoint",
                step=10 * attempt, uri=f"file:///c/{attempt}",
            )  # fmt: skip
            assert r.status_code < 300, r.text
        await api.db(lambda s: _expire(s, run_id))
        await reap_once(api.state)
        run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
        assert run["status"] == ("failed" if attempt == 8 else "queued"), (attempt, run)
    assert "crash loop: the worker died on 3 attempts in a row" in run["error"]


async def fail_unclaimed_at(api: Api, seconds_from_now: float) -> list[str]:
    """The reaper's queue-limit pass as if the clock read now + ``seconds_from_now``."""
    now = utcnow() + timedelta(seconds=seconds_from_now)
    limit = api.state.settings.max_queued_s
    return await api.db(lambda s: fail_unclaimed_runs(s, now, after_s=limit))


async def test_a_run_no_worker_takes_fails_at_the_queue_limit_and_frees_its_slot(
    api: Api,
) -> None:
    auth = await api.tenant()
    await api.db(lambda s: s.execute(update(Tenant).values(quota_runs_in_flight=1)))
    run_id = await api.submit(auth)
    refused = await api.client.post("/v1/runs", json={"spec": spec()}, headers=auth)
    assert refused.status_code == 429  # the queued run holds the tenant's one slot
    limit = api.state.settings.max_queued_s
    assert limit == 86_400  # the default: a day
    # Sent again (a lost message) on the way: that does not restart the wait.
    now = utcnow()
    await api.db(lambda s: stranded_queued_runs(s, now + timedelta(hours=12), after_s=300))
    assert await fail_unclaimed_at(api, limit - 60) == []
    assert await fail_unclaimed_at(api, limit + 1) == [run_id]
    run = (await api.client.get(f"/v1/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "failed"
    assert run["error"].startswith("no worker took this run in 24 h in the queue")
    assert "Submit it again later" in run["error"]
    events = (await api.client.get(f"/v1/runs/{run_id}/events", headers=auth)).json()["items"]
    assert (events[-1]["from_status"], events[-1]["to_status"]) == ("queued", "failed")
    # The slot is free again, and a failed run cannot be claimed.
    assert (await api.internal(run_id, "claim", worker_id="w1")).status_code == 409
    await api.submit(auth)


async def test_a_requeued_run_waits_its_limit_again_from_the_requeue(api: Api) -> None:
    run_id = await api.submit(await api.tenant())
    await api.internal(run_id, "claim", worker_id="w1", lease_seconds=60)
    assert await reap_at(api, 3600) == [run_id]  # its worker died: queued again an hour on
    limit = api.state.settings.max_queued_s
    assert await fail_unclaimed_at(api, limit + 1) == []
    assert await fail_unclaimed_at(api, 3600 + limit + 1) == [run_id]


async def test_the_reaper_pass_fails_a_waited_out_run_and_does_not_send_it_again(
    api: Api,
) -> None:
    auth = await api.tenant()
    waited_out, fresh = await api.submit(auth), await api.submit(auth)
    api.dispatcher.sent.clear()
    long_ago = utcnow() - timedelta(days=2)
    await api.db(
        lambda s: s.execute(
            update(Run).where(Run.id == waited_out).values(queued_at=long_ago, updated_at=long_ago)
        )
    )
    await reap_once(api.state)
    assert api.dispatcher.sent == []  # neither the failed run nor the fresh one is sent
    statuses = {
        r: (await api.client.get(f"/v1/runs/{r}", headers=auth)).json()["status"]
        for r in (waited_out, fresh)
    }
    assert statuses == {waited_out: "failed", fresh: "queued"}


async def test_a_queue_limit_of_zero_turns_the_rule_off(api: Api) -> None:
    await api.submit(await api.tenant())
    later = utcnow() + timedelta(days=365)
    assert await api.db(lambda s: fail_unclaimed_runs(s, later, after_s=0)) == []
