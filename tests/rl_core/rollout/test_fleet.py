"""`RolloutFleet` over fake member engines (the fleet's logic alone; a fleet of real vLLM
servers is tests/rl_core/pipeline/test_vllm_fleet.py): an agent's next turn goes to the
member that holds its prefix unless that one is overloaded, new prompts to the least
loaded; a member whose server dies is taken out, its requests are served by the others
with nothing lost, and it comes back on the newest weights; an update reaches every
member up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rl_core.errors import RolloutError
from rl_core.rollout.base import Completion, Grammar, SamplingParams
from rl_core.rollout.fleet import BLOCK, PrefixRoutes, RolloutFleet
from rl_core.rollout.vllm_engine import EngineUnavailable, PreparedWeights

SAMPLING = SamplingParams(temperature=1.0)


class FakeMember:
    """A member engine: answers each prompt with ``seed`` repeated (so a request sent again
    elsewhere answers the same), and can be killed; `recover` brings it back."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.alive = True
        self.served: list[list[int]] = []
        self.updates: list[int] = []
        self.written: list[int] = []
        self.recoveries = 0
        self.fail_recovery = False
        self.hold: asyncio.Event | None = None  # requests wait here while it is set

    async def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        seeds: Sequence[int],
        grammars: Sequence[Grammar | None] | None = None,
        top_logprobs: int = 0,
    ) -> list[Completion]:
        if self.hold is not None:
            await self.hold.wait()
        if not self.alive:
            raise EngineUnavailable("the server exited")
        self.served.extend(list(p) for p in prompts)
        return [
            Completion(
                tokens=[seed % 97] * 4,
                logprobs=[-1.0] * 4,
                finish_reason="length",
                policy_version=self.policy_version,
            )
            for seed in seeds
        ]

    def update_weights(self, params: Any, version: int) -> None:  # alone, not in a fleet
        self.publish(self.prepare(params, version), owned=True)

    def prepare(self, params: Any, version: int) -> PreparedWeights:
        self.written.append(version)
        return PreparedWeights(Path(f"/nonexistent/v{version}"), version, None, 0.0)

    def publish(self, prepared: PreparedWeights, *, owned: bool) -> None:
        if not self.alive:
            raise EngineUnavailable("the server exited")
        self.policy_version = prepared.version
        self.updates.append(prepared.version)

    def recover(self, why: str, weights: PreparedWeights | None = None) -> None:
        if self.fail_recovery:
            raise RolloutError("the server exited again at start")
        time.sleep(0.05)
        self.alive = True
        self.recoveries += 1
        if weights is not None:  # restarted onto the fleet's newest weights
            self.policy_version = weights.version


def prompt(task: int, length: int = 3 * BLOCK) -> list[int]:
    return [task] * length


def test_routes_remember_the_longest_prefix_block_by_block() -> None:
    routes = PrefixRoutes()
    routes.record(list(range(40)), member=1)  # 2 whole blocks
    assert routes.longest([*range(40), 7, 7]) == (1, 2)
    assert routes.longest(list(range(20)) + [9] * 20) == (1, 1)
    assert routes.longest([5, *range(39)]) == (None, 0)
    routes.forget(1)
    assert routes.longest(list(range(40))) == (None, 0)


def test_a_next_turn_goes_to_the_member_holding_its_prefix_and_new_prompts_spread() -> None:
    members = [FakeMember(), FakeMember()]
    fleet = RolloutFleet(members)

    async def play() -> None:
        first = [prompt(t) for t in range(8)]
        done = await fleet.generate(
            first, max_new_tokens=4, sampling=SAMPLING, seeds=list(range(8))
        )
        # Eight new prompts at once: four each (least loaded).
        assert [len(m.served) for m in members] == [4, 4]
        where = {
            t: next(i for i, m in enumerate(members) if first[t] in m.served) for t in range(8)
        }
        # Each one's next turn (its prompt, completion and a new observation) goes back.
        turns = [first[t] + done[t].tokens + [50 + t] * BLOCK for t in range(8)]
        for m in members:
            m.served.clear()
        await fleet.generate(turns, max_new_tokens=4, sampling=SAMPLING, seeds=list(range(8)))
        for t in range(8):
            assert turns[t] in members[where[t]].served

    asyncio.run(play())


def test_an_overloaded_member_loses_its_prefix_requests_to_the_least_loaded() -> None:
    members = [FakeMember(), FakeMember()]
    fleet = RolloutFleet(members, slack=2)

    async def play() -> None:
        await fleet.generate([prompt(1)], max_new_tokens=4, sampling=SAMPLING, seeds=[1])
        home = 0 if members[0].served else 1
        members[home].hold = asyncio.Event()  # its requests queue up
        held = [
            asyncio.create_task(
                fleet.generate(
                    [prompt(1) + [i] * BLOCK], max_new_tokens=4, sampling=SAMPLING, seeds=[i]
                )
            )
            for i in range(6)
        ]
        await asyncio.sleep(0.05)
        # Three went home (outstanding 0, 1, 2 <= 0 + slack), the rest to the other.
        assert fleet.outstanding[home] == 3
        assert len(members[1 - home].served) == 3
        members[home].hold.set()
        await asyncio.gather(*held)

    asyncio.run(play())


def test_a_member_that_dies_is_taken_out_its_requests_served_elsewhere_and_it_comes_back() -> None:
    members = [FakeMember(), FakeMember()]
    fleet = RolloutFleet(members)

    async def play() -> list[Completion]:
        fleet.update_weights(params=None, version=1)
        members[0].hold = members[1].hold = asyncio.Event()  # both busy: three each
        calls = [
            asyncio.create_task(
                fleet.generate([prompt(t)], max_new_tokens=4, sampling=SAMPLING, seeds=[t])
            )
            for t in range(6)
        ]
        await asyncio.sleep(0.05)
        assert fleet.outstanding == [3, 3]  # three in flight on member 0 ...
        members[0].alive = False  # ... when its server dies
        members[0].hold.set()
        results = [c for call in await asyncio.gather(*calls) for c in call]
        # The next update goes on without it; it catches up when it is back.
        fleet.update_weights(params=None, version=2)
        deadline = time.monotonic() + 10
        while not fleet.up[0]:
            assert time.monotonic() < deadline, "the member never came back"
            await asyncio.sleep(0.01)
        return results

    results = asyncio.run(play())
    # Every request answered once, as its seed says, the lost three by member 1.
    assert [c.tokens for c in results] == [[t % 97] * 4 for t in range(6)]
    assert len(members[1].served) == 6 and fleet.resent == 3
    assert members[0].recoveries == 1 and members[0].policy_version == 2
    assert fleet.policy_version == 2
    metrics = fleet.update_metrics()
    assert metrics["fleet/servers_up"] == 2 and metrics["fleet/resent"] == 3
    fleet.close()


def test_an_update_reaches_every_member_up_at_once() -> None:
    members = [FakeMember(), FakeMember(), FakeMember()]
    seen: list[str] = []
    barrier = threading.Barrier(3, timeout=5)

    def together(member: FakeMember, name: str) -> Any:
        original = member.publish

        def update(prepared: PreparedWeights, *, owned: bool) -> None:
            barrier.wait()  # all three are updating at the same time, or this times out
            seen.append(name)
            original(prepared, owned=owned)

        return update

    for i, m in enumerate(members):
        m.publish = together(m, str(i))  # type: ignore[method-assign]
    fleet = RolloutFleet(members)
    fleet.update_weights(params=None, version=5)
    assert sorted(seen) == ["0", "1", "2"]
    assert [m.policy_version for m in members] == [5, 5, 5]
    # The weights were written once, for all three.
    assert [m.written for m in members] == [[5], [], []]


def test_a_member_that_cannot_come_back_fails_the_run_with_the_reason() -> None:
    members = [FakeMember(), FakeMember()]
    members[0].alive = members[1].alive = False
    members[0].fail_recovery = members[1].fail_recovery = True
    fleet = RolloutFleet(members, recovery_timeout_s=5)

    async def play() -> None:
        await fleet.generate([prompt(1)], max_new_tokens=4, sampling=SAMPLING, seeds=[1])

    with pytest.raises(RolloutError, match="exited again at start"):
        asyncio.run(play())
    fleet.close()
