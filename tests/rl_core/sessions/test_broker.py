"""`SessionBroker`'s groups when the collector offers a group's episodes one by one.

The collector starts a group's members as places free up (its concurrency semaphore),
so a client may find only part of a group waiting. A name keeps its group until every
member is claimed: its later sessions wait for that group's next member rather than
start a second group (which would strand the first group's unclaimed members and, one
group at a time, every place of the run). A name that never sends the rest leaves them
to end ``group_not_filled`` after the fill timeout, freeing their places.
"""

from __future__ import annotations

import asyncio

import pytest

from rl_core.agent.ledger import Trajectory
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.broker import NoRoom, SessionBroker
from rl_core.sessions.session import SessionConfig


def broker(group_size: int, fill_timeout_s: float = 60.0) -> SessionBroker:
    tok = BuiltinTokenizer()
    return SessionBroker(
        engine=ScriptedEngine([[tok.end_of_turn_id]], stop_ids=[tok.end_of_turn_id]),
        tokenizer=tok,
        config=SessionConfig(sampling=SamplingParams()),
        group_size=group_size,
        fill_timeout_s=fill_timeout_s,
    )


def offer(b: SessionBroker, group: int, member: int) -> tuple[Trajectory, asyncio.Task[None]]:
    traj = Trajectory(episode_id=f"g{group}-e{member}", group=group, member=member)
    return traj, asyncio.create_task(b.play(traj, timeout_s=None))


def test_a_name_waits_for_its_groups_next_member_rather_than_start_another() -> None:
    async def main() -> None:
        b = broker(group_size=3)
        offer(b, 0, 0)  # group 0: one member offered so far
        offer(b, 1, 0)  # group 1 begins too
        await asyncio.sleep(0)
        first = await b.open("task-a")
        assert first.session_id == "g0-e0"
        with pytest.raises(NoRoom):
            await b.open("task-a")  # group 1 is free, but task-a's group is 0
        waiting = asyncio.create_task(b.open("task-a", wait_s=5))
        await asyncio.sleep(0.01)
        offer(b, 0, 1)
        assert (await waiting).session_id == "g0-e1"
        assert (await b.open("task-b")).session_id == "g1-e0"
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    asyncio.run(main())


def test_members_a_name_never_claims_end_unfilled_after_the_fill_timeout() -> None:
    async def main() -> None:
        b = broker(group_size=3, fill_timeout_s=0.2)
        played = [offer(b, 0, m) for m in range(3)]
        await asyncio.sleep(0)
        session = await b.open("task-a")  # the client sends one session of three
        (lost1, t1), (lost2, t2) = played[1], played[2]
        await asyncio.wait_for(asyncio.gather(t1, t2), 2)
        assert lost1.end_state == lost2.end_state == "cancelled"
        assert lost1.end_reason == "group_not_filled"
        assert b.step_metrics()["sessions/unfilled"] == 2
        # Every member accounted for (one claimed, two unfilled): the name is free again.
        assert session.session_id == "g0-e0"
        offer(b, 1, 0)
        await asyncio.sleep(0)
        assert (await b.open("task-a")).session_id == "g1-e0"
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()

    asyncio.run(main())
