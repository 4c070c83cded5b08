"""The AIMD limit on requests in flight to one environment server, and its permits.

The controller keeps no clock: its windows are counted in requests (one cut per window,
a request's window being the cuts made before it went out), so these tests order
requests and answers as events, with no time in them at all.
"""

from __future__ import annotations

import asyncio

import pytest

from rl_core.envs.adaptive import AdaptiveSlots, AimdLimit


def test_an_overload_halves_the_limit_once_per_window_down_to_the_floor() -> None:
    limit = AimdLimit(16)
    burst = [limit.admit() for _ in range(16)]  # all sent under the first limit
    assert limit.overloaded(burst[0]) == "absorbed" and limit.permits == 8
    # The rest of the burst was sent under 16: it says nothing new about 8.
    assert all(limit.overloaded(epoch) == "absorbed" for epoch in burst[1:])
    assert (limit.permits, limit.cuts, limit.in_flight) == (8, 1, 0)
    for expected in (4, 2, 1):
        epoch = limit.admit()  # sent under the lowered limit, and still too many
        assert limit.overloaded(epoch) == "absorbed" and limit.permits == expected
    assert limit.cuts == 4 and limit.take_lowest() == 1


def test_at_the_floor_an_overload_counts_as_a_failure_and_cuts_nothing() -> None:
    limit = AimdLimit(4, floor=1)
    limit.limit = 1.0
    epoch = limit.admit()
    assert limit.overloaded(epoch) == "counted"
    assert (limit.permits, limit.cuts) == (1, 0)


def test_a_request_in_flight_when_the_limit_reached_the_floor_is_still_retried() -> None:
    """The limit was lowered while it was in flight: its retry goes out under the new
    limit, which is the answer to the overload, so it is not a failure yet."""
    limit = AimdLimit(2)
    old, new = limit.admit(), limit.admit()
    assert limit.overloaded(new) == "absorbed" and limit.permits == 1
    assert limit.overloaded(old) == "absorbed" and limit.cuts == 1


def test_successes_add_one_request_per_limits_worth_up_to_the_ceiling() -> None:
    limit = AimdLimit(6)
    limit.limit = 2.0
    seen = []
    for _ in range(12):
        limit.succeeded(limit.admit())
        seen.append(limit.permits)
    # 2 successes to reach 3, 3 more to reach 4, then 5 more to reach 5: +1/limit each.
    assert seen == [2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 5, 5]
    for _ in range(50):
        limit.succeeded(limit.admit())
    assert limit.permits == 6 and limit.limit == 6.0  # never above the registered cap


def test_failures_that_say_nothing_about_load_leave_the_limit_alone() -> None:
    limit = AimdLimit(8)
    for _ in range(20):
        limit.ended(limit.admit())  # a 500, a 4xx, a wrong answer, a cancelled request
    assert (limit.permits, limit.cuts, limit.in_flight) == (8, 0, 0)
    with pytest.raises(RuntimeError, match="never admitted"):
        limit.ended(0)


def test_the_lowest_limit_is_reported_once_per_reading() -> None:
    limit = AimdLimit(8)
    limit.overloaded(limit.admit())
    limit.overloaded(limit.admit())
    for _ in range(20):
        limit.succeeded(limit.admit())
    assert limit.take_lowest() == 2 and limit.permits > 2
    assert limit.take_lowest() == limit.permits  # nothing lower since the last reading


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        AimdLimit(4, floor=5)
    with pytest.raises(ValueError, match="decrease"):
        AimdLimit(4, decrease=1.0)


def test_permits_are_handed_out_in_order_as_the_lowered_limit_allows() -> None:
    async def main() -> None:
        slots = AdaptiveSlots(AimdLimit(4))
        held = [await slots.acquire() for _ in range(4)]
        order: list[int] = []

        async def wait(i: int) -> int:
            epoch = await slots.acquire()
            order.append(i)
            return epoch

        waiters = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0)  # all three are queued
        assert slots.waiting == 3
        assert slots.overloaded(held[0]) == "absorbed"  # limit 2, and 3 still in flight
        slots.succeeded(held[1])  # 2 in flight: still no room
        await asyncio.sleep(0)
        assert order == [] and slots.waiting == 3
        slots.ended(held[2])  # 1 in flight: one may go
        first = await waiters[0]
        assert order == [0] and first == 1  # sent in the window after the cut
        slots.ended(held[3])
        await waiters[1]
        assert order == [0, 1] and slots.limit.in_flight == 2 and slots.waiting == 1
        waiters[2].cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiters[2]
        assert slots.waiting == 0 and slots.limit.in_flight == 2

    asyncio.run(main())


def test_a_permit_granted_to_a_waiter_that_gave_up_goes_to_the_next() -> None:
    """A deadline that passes just as the permit arrives must not leak the permit."""

    async def main() -> None:
        slots = AdaptiveSlots(AimdLimit(1))
        held = await slots.acquire()
        late = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        nxt = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        slots.succeeded(held)  # grants the permit to `late`...
        late.cancel()  # ...which gives up before it runs again
        with pytest.raises(asyncio.CancelledError):
            await late
        await nxt  # so the permit went on to the next waiter
        assert slots.limit.in_flight == 1 and slots.waiting == 0

    asyncio.run(main())
