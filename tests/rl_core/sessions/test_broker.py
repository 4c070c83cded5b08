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
from rl_core.errors import ClientFaults
from rl_core.models.tokenizer import BuiltinTokenizer
from rl_core.protocol.chat_completions import ChatCompletionError, parse_request
from rl_core.rollout.base import SamplingParams
from rl_core.rollout.fake import ScriptedEngine
from rl_core.sessions.broker import REOFFERS_PER_SLOT, NoRoom, SessionBroker
from rl_core.sessions.session import SessionConfig


def broker(
    group_size: int,
    fill_timeout_s: float = 60.0,
    client_fault_budget: int = 64,
    reoffer_timeout_s: float = 10.0,
) -> SessionBroker:
    tok = BuiltinTokenizer()
    return SessionBroker(
        engine=ScriptedEngine([[tok.end_of_turn_id]], stop_ids=[tok.end_of_turn_id]),
        tokenizer=tok,
        config=SessionConfig(sampling=SamplingParams()),
        group_size=group_size,
        fill_timeout_s=fill_timeout_s,
        client_fault_budget=client_fault_budget,
        reoffer_timeout_s=reoffer_timeout_s,
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


# --- client faults: a slot whose session a client fails is offered again ----------------


async def _call(b: SessionBroker, session_id: str, key: str) -> None:
    request = parse_request({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    await b.complete(session_id, key, request)


def test_a_cancelled_sessions_slot_is_offered_again_and_its_group_still_fills() -> None:
    async def main() -> None:
        b = broker(group_size=2)
        (traj0, task0), (traj1, task1) = offer(b, 0, 0), offer(b, 0, 1)
        await asyncio.sleep(0)
        first = await b.open("task-a")
        other = await b.open("task-a")
        await _call(b, first.session_id, first.key)
        b.cancel(first.session_id, first.key)  # the client's agent failed
        await asyncio.sleep(0)
        # The same group's slot, under a new session id, for the name's next session.
        again = await b.open("task-a")
        assert (first.session_id, again.session_id) == ("g0-e0", "g0-e0-o1")
        assert again.key != first.key
        for s in (again, other):
            await _call(b, s.session_id, s.key)
            b.end(s.session_id, s.key, 1.0)
        await asyncio.wait_for(asyncio.gather(task0, task1), 2)
        assert traj0.end_state == traj1.end_state == "done"
        assert traj0.episode_id == "g0-e0-o1"  # the session that played it
        (faulted,) = b.drain_faulted()  # recorded apart, never in the group
        assert faulted.episode_id == "g0-e0" and faulted.end_state == "cancelled"
        assert faulted.end_reason == "client_cancelled" and faulted.turns == 1
        metrics = b.step_metrics()
        assert metrics["sessions/reoffered"] == metrics["sessions/client_faults"] == 1
        assert metrics["sessions/fault_streak"] == 0  # a reward since

    asyncio.run(main())


def test_a_named_groups_slot_offered_again_waits_briefly_for_its_names_next_session() -> None:
    async def main() -> None:
        b = broker(group_size=2, reoffer_timeout_s=0.1)
        (traj0, task0), (traj1, task1) = offer(b, 0, 0), offer(b, 0, 1)
        await asyncio.sleep(0)
        first, second = await b.open("task-a"), await b.open("task-a")
        await _call(b, second.session_id, second.key)
        b.end(second.session_id, second.key, 1.0)
        b.cancel(first.session_id, first.key)  # and the client never retries
        await asyncio.wait_for(asyncio.gather(task0, task1), 2)
        assert (traj0.end_state, traj0.end_reason) == ("cancelled", "group_not_filled")
        assert traj0.episode_id == "g0-e0-o1" and traj1.end_state == "done"
        metrics = b.step_metrics()
        assert metrics["sessions/reoffered"] == metrics["sessions/unfilled"] == 1

    asyncio.run(main())


def test_an_abandoned_session_times_out_and_an_unnamed_session_takes_its_slot() -> None:
    async def main() -> None:
        b = broker(group_size=1)
        traj = Trajectory(episode_id="g1-e0", group=1, member=0)
        task = asyncio.create_task(b.play(traj, timeout_s=0.05))
        await asyncio.sleep(0)
        abandoned = await b.open()
        await asyncio.sleep(0.1)  # past the episode timeout: offered again
        assert b.step_metrics()["sessions/client_faults"] == 1
        retried = await b.open(wait_s=1)
        assert retried.session_id == "g1-e0-o1" != abandoned.session_id
        await _call(b, retried.session_id, retried.key)
        b.end(retried.session_id, retried.key, 0.5)
        await asyncio.wait_for(task, 2)
        assert traj.end_state == "done" and traj.reward == 0.5
        (timed_out,) = b.drain_faulted()
        assert (timed_out.end_state, timed_out.end_reason) == ("timeout", "episode_timeout")

    asyncio.run(main())


def test_a_slot_is_offered_again_a_bounded_number_of_times() -> None:
    async def main() -> None:
        b = broker(group_size=1)
        traj, task = offer(b, 0, 0)
        for _ in range(REOFFERS_PER_SLOT + 1):
            session = await b.open(wait_s=1)
            b.cancel(session.session_id, session.key)
        await asyncio.wait_for(task, 2)
        # The last session's end is the episode's: its group trains without it.
        assert traj.end_state == "cancelled" and traj.episode_id.endswith(f"-o{REOFFERS_PER_SLOT}")
        assert len(b.drain_faulted()) == REOFFERS_PER_SLOT
        assert b.step_metrics()["sessions/reoffered"] == REOFFERS_PER_SLOT

    asyncio.run(main())


def test_a_fault_after_the_budget_is_spent_fails_with_the_budgets_error() -> None:
    # Two sessions open when the first fault spends a budget of one: the second, cancelled
    # while the run is failing, ends its episode with the same error, not a longer streak's.
    async def main() -> None:
        b = broker(group_size=2, client_fault_budget=1)
        played = [offer(b, 0, m) for m in range(2)]
        await asyncio.sleep(0)
        first, second = await b.open(wait_s=1), await b.open(wait_s=1)
        b.cancel(first.session_id, first.key)
        b.cancel(second.session_id, second.key)
        done, _ = await asyncio.wait([t for _, t in played], timeout=2)
        errors = [str(t.exception()) for t in done]
        assert len(errors) == 2
        assert all(e.startswith("1 sessions in a row ended without a reward (1 cancelled")
                   for e in errors), errors  # fmt: skip
        assert b.step_metrics()["sessions/client_faults"] == 2

    asyncio.run(main())


def test_clients_failing_past_the_budget_fail_the_run_with_their_reason() -> None:
    async def main() -> None:
        b = broker(group_size=2, client_fault_budget=3)
        played = [offer(b, g, m) for g in range(2) for m in range(2)]
        await asyncio.sleep(0)
        # Two faults, then a reward: the streak starts again.
        for reward in (None, None, 1.0):
            s = await b.open(wait_s=1)
            if reward is None:
                b.cancel(s.session_id, s.key)
            else:
                await _call(b, s.session_id, s.key)
                b.end(s.session_id, s.key, reward)
            await asyncio.sleep(0)
        assert b.step_metrics()["sessions/fault_streak"] == 0
        opened = [await b.open(wait_s=1) for _ in range(3)]
        for s in opened:
            b.cancel(s.session_id, s.key)
        done, _ = await asyncio.wait([t for _, t in played], timeout=2)
        (failed,) = [t for t in done if not t.cancelled() and t.exception() is not None]
        error = failed.exception()
        assert isinstance(error, ClientFaults)
        assert "3 sessions in a row ended without a reward (3 cancelled" in str(error)
        assert "rollout.client_fault_budget" in str(error)
        # No session opens after, and the clients still in one are told why.
        with pytest.raises(ChatCompletionError) as refused:
            await b.open()
        assert refused.value.status == 410 and "ClientFaults" in str(refused.value)
        with pytest.raises(ChatCompletionError) as ended:
            b.session(opened[0].session_id, opened[0].key)
        assert ended.value.status == 410 and ended.value.code == "run_ended"
        for _, t in played:
            t.cancel()

    asyncio.run(main())


def test_once_the_run_ends_a_sessions_real_key_hears_it_and_others_hear_nothing() -> None:
    async def main() -> None:
        b = broker(group_size=1)
        b.sign_keys("the-gateway-token")
        _, task = offer(b, 0, 0)
        session = await b.open(wait_s=1)
        assert session.key == b.session_key(session.session_id)
        b.close("finished its steps")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with pytest.raises(ChatCompletionError) as ended:
            b.session(session.session_id, session.key)
        assert ended.value.status == 410 and "finished its steps" in str(ended.value)
        with pytest.raises(ChatCompletionError) as unknown:
            b.session(session.session_id, "a-guess")
        assert unknown.value.status == 404
        with pytest.raises(ChatCompletionError) as refused:
            await b.open()
        assert refused.value.status == 410

    asyncio.run(main())
