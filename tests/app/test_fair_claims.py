"""Fair claims on real Postgres, through the worker's claim route: one tenant's queue does
not starve another's run (app.services.fair)."""

from __future__ import annotations

import httpx
import pytest

from tests.app.conftest import Api

pytestmark = pytest.mark.anyio


async def fair_claim(api: Api, message_run_id: str, worker_id: str) -> httpx.Response:
    """The claim a worker's task makes for the run its Celery message names."""
    r = await api.internal(message_run_id, "claim", worker_id=worker_id, fair=True)
    if r.status_code == 200:  # keep the lease token under the run actually taken
        api.leases[r.json()["run_id"]] = r.json()["lease_token"]
    return r


async def finish(api: Api, run_id: str, worker_id: str) -> None:
    for status in ("running", "succeeded"):
        r = await api.internal(run_id, "status", worker_id=worker_id, status=status)
        assert r.status_code == 200, r.text


async def test_one_worker_starts_tenant_bs_single_run_before_tenant_as_later_ones(
    api: Api,
) -> None:
    a, b = await api.tenant("a"), await api.tenant("b")
    a_runs = [await api.submit(a) for _ in range(5)]
    b_run = await api.submit(b)
    # The broker holds the messages in the order they were sent: A's five, then B's.
    assert api.dispatcher.sent == [*a_runs, b_run]
    started = []
    for message in api.dispatcher.sent:  # one worker, one run at a time
        r = await fair_claim(api, message, "w1")
        assert r.status_code == 200, r.text
        started.append(r.json()["run_id"])
        await finish(api, started[-1], "w1")
    # A's first run, then B's (A was served last), then the rest of A's in their order.
    assert started == [a_runs[0], b_run, *a_runs[1:]]


async def test_the_tenant_with_fewer_runs_going_is_served_first(api: Api) -> None:
    a, b = await api.tenant("a"), await api.tenant("b")
    a_runs = [await api.submit(a) for _ in range(4)]
    b_runs = [await api.submit(b) for _ in range(2)]
    taken = [(await fair_claim(api, m, f"w{i}")).json()["run_id"] for i, m in enumerate(a_runs)]
    # Four workers: they alternate between the tenants while both have runs queued.
    assert taken == [a_runs[0], b_runs[0], a_runs[1], b_runs[1]]
    # Both tenants have two runs going and B was served last: A's next run goes before the
    # one B submits now.
    b_third = await api.submit(b)
    r = await fair_claim(api, b_third, "w4")
    assert r.json()["run_id"] == a_runs[2]
    # Now A has three going and B two: B's run goes first although A's is older.
    r = await fair_claim(api, a_runs[3], "w5")
    assert r.json()["run_id"] == b_third


async def test_a_message_whose_run_was_taken_takes_the_next_or_finds_nothing(api: Api) -> None:
    auth = await api.tenant()
    first, second = await api.submit(auth), await api.submit(auth)
    # The message for the second run arrives first: it takes the first run (oldest).
    r = await fair_claim(api, second, "w1")
    assert r.status_code == 200 and r.json()["run_id"] == first
    r = await fair_claim(api, first, "w2")
    assert r.status_code == 200 and r.json()["run_id"] == second
    # A duplicate message finds nothing queued: 409, and the worker drops it.
    r = await fair_claim(api, first, "w3")
    assert r.status_code == 409 and "no run is queued" in r.json()["error"]["message"]
    # Without fair, the claim still takes exactly the run it names (workers of the release
    # before), and refuses a run that is not queued.
    third = await api.submit(auth)
    fourth = await api.submit(auth)
    r = await api.internal(fourth, "claim", worker_id="w4")
    assert r.status_code == 200 and r.json()["run_id"] == fourth
    assert (await fair_claim(api, fourth, "w5")).json()["run_id"] == third


async def test_a_worker_holding_a_base_takes_its_tenants_run_on_that_base_first(
    api: Api,
) -> None:
    """A worker hosting several runs names the bases it holds (docs/shared-base.md): among
    the runs of the tenant fair order picks, one on such a base goes first; the tenants'
    order is kept, and a claim naming none takes the oldest."""
    a, b = await api.tenant("a"), await api.tenant("b")
    tiny = await api.submit(a)  # builtin:tiny, the default
    small = await api.submit(a, model={"source": "builtin:small"})
    b_run = await api.submit(b, model={"source": "builtin:small"})
    r = await api.internal(tiny, "claim", worker_id="w1", fair=True, bases=["builtin:small"])
    assert r.json()["run_id"] == small  # A's newer run, on the held base
    # B has none going and A one: B's run is next whatever the worker holds.
    r = await api.internal(tiny, "claim", worker_id="w1", fair=True, bases=["builtin:tiny"])
    assert r.json()["run_id"] == b_run
    r = await api.internal(tiny, "claim", worker_id="w2", fair=True)
    assert r.json()["run_id"] == tiny


async def test_a_claim_naming_too_many_bases_is_refused_with_the_field(api: Api) -> None:
    a = await api.tenant("a")
    run = await api.submit(a)
    r = await api.internal(run, "claim", worker_id="w1", fair=True, bases=["builtin:tiny"] * 65)
    assert r.status_code == 422 and "bases" in r.text, r.text
