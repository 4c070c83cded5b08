"""`SessionBroker`: where the collector's episodes meet the clients' sessions.

In a run whose environment is ``sessions`` the collector plays no environment: each
episode it starts is a **slot** that waits for a client (`SessionAgent.run_episode`).
The collector's admission is unchanged, so a slot is an episode in flight: at most
``rollout.concurrency`` of them, and none past the staleness bound. A client that opens
a session takes a waiting slot; when there is none it is told to come back
(`NoRoom`, HTTP 429 with Retry-After), which is the run's backpressure.

Groups: the collector starts ``group_size`` slots per task, and GRPO takes the
advantages of one group's episodes against each other. A client names the group a
session belongs to (any string, e.g. its task id): the first session of a name takes
a task whose slots are all waiting, the next ``group_size - 1`` sessions of that name
take its other slots, and a name whose group is full starts another group. Sessions
opened without a name fill groups in the order they open, so their advantages are
taken against unrelated tasks' (``algorithm.baseline: batch`` then says more).

A session ends when the client reports its reward (`end`), as ``cancelled`` when the
client gives it up (`cancel`: its agent failed), or as ``timeout`` after
``rollout.episode_timeout_s`` from its opening, or as ``cancelled`` when the run
stops; a timed-out or cancelled session is removed from its group and never scored
(the collector's group rule). Each session has its own key (a bearer token) that
only opens that session.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.agent.ledger import Trajectory
from rl_core.host.telemetry import SpanRecorder, now_us
from rl_core.models.tokenizer import Tokenizer
from rl_core.protocol.chat_completions import (
    ChatCompletion,
    ChatCompletionError,
    ChatCompletionRequest,
)
from rl_core.protocol.completions import CompletionRequest, TextCompletion
from rl_core.rollout.base import RolloutEngine
from rl_core.sessions.session import ChatSession, SessionConfig

RETRY_AFTER_S = 1
# How long a named group's unclaimed members wait for the rest of its name's sessions.
GROUP_FILL_TIMEOUT_S = 120.0


class NoRoom(ChatCompletionError):
    """Every episode the run may have in flight is taken: come back later."""

    def __init__(self, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(
            "every session this run may have open is taken (rollout.concurrency and the "
            f"staleness bound); retry after {retry_after_s} s",
            code="no_free_session",
            status=429,
            type="rate_limit_error",
        )
        self.retry_after_s = retry_after_s


@dataclasses.dataclass(eq=False)
class _Slot:
    """One episode of the collector, waiting for a client or played by one."""

    episode_id: str
    group: int
    member: int
    claimed: asyncio.Future[OpenSession]
    # The wait for a client; given a deadline once the slot's group belongs to a name.
    wait: asyncio.Timeout | None = None


@dataclasses.dataclass(eq=False)
class OpenSession:
    session_id: str
    key: str
    chat: ChatSession
    # (reward, turn rewards) from `end`; None from `cancel`.
    ended: asyncio.Future[tuple[float, list[float] | None] | None]
    opened: float = dataclasses.field(default_factory=time.monotonic)
    opened_us: int = dataclasses.field(default_factory=now_us)  # the timeline's clock

    @property
    def over(self) -> bool:
        return self.ended.done()


class SessionBroker:
    def __init__(
        self,
        *,
        engine: RolloutEngine,
        tokenizer: Tokenizer,
        config: SessionConfig,
        group_size: int,
        fill_timeout_s: float = GROUP_FILL_TIMEOUT_S,
        recorder: SpanRecorder | None = None,
    ) -> None:
        self.engine = engine
        self.recorder = recorder or SpanRecorder()
        self.tokenizer = tokenizer
        self.config = config
        self.group_size = group_size
        self.fill_timeout_s = fill_timeout_s
        self._waiting: dict[int, collections.OrderedDict[int, _Slot]] = {}  # group -> members
        self._named: dict[str, int] = {}  # client group name -> collector group
        self._taken: set[int] = set()  # groups some client has opened a session in
        # Members of a taken group that were claimed or gave up waiting; at group_size the
        # group is forgotten (its name free for a new group).
        self._settled: collections.Counter[int] = collections.Counter()
        self._sessions: dict[str, OpenSession] = {}
        self._counted: dict[str, int] = {
            "opened": 0,
            "refused": 0,
            "prefix_breaks": 0,
            "unfilled": 0,
        }
        # Set (and replaced) whenever a slot starts waiting: wakes clients waiting to open.
        self._slot_offered = asyncio.Event()
        self._reported = dict(self._counted)

    # -- the collector's side ------------------------------------------------------------

    async def run_episode(
        self,
        env: object,
        *,
        episode_id: str,
        env_seed: int,
        sample_seed: int,
        env_config: Mapping[str, Any],
        timeout_s: float | None = None,
        into: Trajectory | None = None,
    ) -> Trajectory:
        """The collector's episode (`rl_core.agent.agent.Agent.run_episode`'s signature):
        there is no environment to play, and the seeds are the client's business."""
        traj = into or Trajectory(episode_id=episode_id)
        await self.play(traj, timeout_s=timeout_s)
        return traj

    async def play(self, traj: Trajectory, *, timeout_s: float | None) -> None:
        """Offer ``traj``'s episode to clients and fill it from the session that takes it."""
        loop = asyncio.get_running_loop()
        slot = _Slot(traj.episode_id, traj.group, traj.member, loop.create_future())
        self._waiting.setdefault(slot.group, collections.OrderedDict())[slot.member] = slot
        self._slot_offered.set()
        self._slot_offered = asyncio.Event()
        traj.enter("waiting_client")
        try:
            async with asyncio.timeout(None) as slot.wait:
                if slot.group in self._named.values():
                    self._set_fill_deadline(slot)
                session = await slot.claimed
        except TimeoutError:
            # Its group's name never sent this many sessions: the member ends unplayed and
            # the group trains without it (as with a failed episode), freeing its place.
            self._counted["unfilled"] += 1
            traj.end("cancelled", "group_not_filled")
            return
        finally:
            self._forget_slot(slot)
        traj.started = session.opened
        traj.enter("client")
        try:
            await self._played(traj, session, timeout_s)
        finally:
            self.recorder.add(
                "rollout",
                start_us=session.opened_us,
                dur_us=now_us() - session.opened_us,
                track=f"episode/{traj.episode_id}",
                step=traj.policy_version,
                args={"end_state": traj.end_state or "cancelled", "turns": traj.turns},
            )

    async def _played(
        self, traj: Trajectory, session: OpenSession, timeout_s: float | None
    ) -> None:
        """Wait for the client's end (or the timeout) and fill ``traj`` from its calls."""
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await asyncio.shield(session.ended)
        except TimeoutError:
            session.ended.cancel()
            _fill(traj, session.chat, None, None, "timeout", "episode_timeout")
            return
        except asyncio.CancelledError:
            session.ended.cancel()
            raise
        finally:
            self._sessions.pop(session.session_id, None)
        if outcome is None:
            _fill(traj, session.chat, None, None, "cancelled", "client_cancelled")
            return
        _fill(traj, session.chat, *outcome, "done", "client_done")
        self._counted["prefix_breaks"] += len(session.chat.ledger.breaks)

    def _forget_slot(self, slot: _Slot) -> None:
        members = self._waiting.get(slot.group)
        if members is not None and members.get(slot.member) is slot:
            del members[slot.member]
            if not members:
                del self._waiting[slot.group]
        if slot.group in self._taken:
            self._settled[slot.group] += 1
            if self._settled[slot.group] >= self.group_size:
                self._forget_group(slot.group)

    def _forget_group(self, group: int) -> None:
        """Every member of ``group`` is accounted for: its name may start a new group."""
        self._taken.discard(group)
        del self._settled[group]
        for name in [n for n, g in self._named.items() if g == group]:
            del self._named[name]

    def _set_fill_deadline(self, slot: _Slot) -> None:
        if slot.wait is not None:
            slot.wait.reschedule(asyncio.get_running_loop().time() + self.fill_timeout_s)

    # -- the clients' side ---------------------------------------------------------------

    async def open(self, group: str | None = None, *, wait_s: float = 0.0) -> OpenSession:
        """A new session in the named group (see the module docstring), waiting up to
        ``wait_s`` for a free episode; `NoRoom` if none came.

        Waiting here rather than in the client: a client told 429 comes back after
        whole seconds (Retry-After), while a slot offered now is taken at once, so the
        run's episodes do not sit idle between a client's retries.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while (slot := self._free_slot(group)) is None:
            offered = self._slot_offered
            try:
                async with asyncio.timeout_at(deadline):
                    await offered.wait()
            except TimeoutError:
                self._counted["refused"] += 1
                raise NoRoom() from None
        members = self._waiting[slot.group]
        del members[slot.member]
        if not members:
            del self._waiting[slot.group]
        first = slot.group not in self._taken
        self._taken.add(slot.group)
        if group is not None and first:
            # The name holds the group until all its members are claimed: the rest may
            # not be offered yet (the collector starts episodes as places free up).
            self._named[group] = slot.group
            for waiting in self._waiting.get(slot.group, {}).values():
                self._set_fill_deadline(waiting)
        chat = ChatSession(
            slot.episode_id, engine=self.engine, tokenizer=self.tokenizer, config=self.config
        )
        session = OpenSession(
            session_id=slot.episode_id,
            key=secrets.token_urlsafe(24),
            chat=chat,
            ended=asyncio.get_running_loop().create_future(),
        )
        self._sessions[session.session_id] = session
        slot.claimed.set_result(session)
        self._counted["opened"] += 1
        return session

    def _free_slot(self, group: str | None) -> _Slot | None:
        if group is not None and group in self._named:
            # Its group's next member, when offered; never a second group meanwhile.
            members = self._waiting.get(self._named[group])
            return next(iter(members.values())) if members else None
        # A group no one has opened a session in yet; unnamed sessions first fill the
        # unnamed group already begun.
        candidates = [g for g, members in self._waiting.items() if members]
        if group is None:
            begun = [g for g in candidates if g in self._taken and g not in self._named.values()]
            if begun:
                return next(iter(self._waiting[begun[0]].values()))
        fresh = [g for g in candidates if g not in self._taken]
        return next(iter(self._waiting[fresh[0]].values())) if fresh else None

    def session(self, session_id: str, key: str) -> OpenSession:
        """The open session ``session_id`` if ``key`` is its key; 404 otherwise (a wrong key
        and an unknown session look the same, so keys cannot be probed for ids)."""
        session = self._sessions.get(session_id)
        if session is None or not hmac.compare_digest(session.key.encode(), key.encode()):
            raise ChatCompletionError(
                f"no open session {session_id!r} for this key: it ended, timed out, or the "
                "key is another session's. Open a new session",
                code="session_not_found",
                status=404,
            )
        return session

    async def complete(
        self, session_id: str, key: str, request: ChatCompletionRequest
    ) -> ChatCompletion:
        session = self.session(session_id, key)
        if session.over:
            raise _ended(session_id)
        with self._call_span(session, kind="chat"):
            return await session.chat.complete(request)

    async def complete_text(
        self, session_id: str, key: str, request: CompletionRequest
    ) -> TextCompletion:
        """A legacy (text) completions call of the session (`ChatSession.complete_text`)."""
        session = self.session(session_id, key)
        if session.over:
            raise _ended(session_id)
        with self._call_span(session, kind="text"):
            return await session.chat.complete_text(request)

    def _call_span(self, session: OpenSession, *, kind: str) -> Any:
        """The call on the session's timeline row, as the built-in agent's model calls are."""
        return self.recorder.span(
            "model_call",
            track=f"episode/{session.session_id}",
            step=self.engine.policy_version,
            turn=len(session.chat.ledger.calls) + 1,
            kind=kind,
        )

    def end(
        self,
        session_id: str,
        key: str,
        reward: float,
        turn_rewards: Sequence[float] | None = None,
    ) -> None:
        """The client's last word: the episode's reward (and, optionally, one per call)."""
        session = self.session(session_id, key)
        if session.over:
            raise _ended(session_id)
        calls = len(session.chat.ledger.calls)
        if calls == 0:
            raise ChatCompletionError(
                "this session made no chat completion calls, so there is nothing to train "
                "on; make at least one call before ending it",
                code="session_empty",
                status=409,
            )
        if turn_rewards is not None and len(turn_rewards) != calls:
            raise ChatCompletionError(
                f"turn_rewards has {len(turn_rewards)} values; the session made {calls} "
                "calls: give one per call, or none",
                param="turn_rewards",
                code="invalid_value",
            )
        if turn_rewards is not None and abs(sum(turn_rewards) - reward) > 1e-6 * max(
            1.0, abs(reward)
        ):
            raise ChatCompletionError(
                f"turn_rewards sum to {sum(turn_rewards)}, not the reward {reward}: "
                "the episode's reward is the sum of its turns'",
                param="turn_rewards",
                code="invalid_value",
            )
        session.ended.set_result((float(reward), list(turn_rewards) if turn_rewards else None))

    def cancel(self, session_id: str, key: str) -> None:
        """The client gives the episode up: it ends ``cancelled``, unscored."""
        session = self.session(session_id, key)
        if session.over:
            raise _ended(session_id)
        session.ended.set_result(None)

    def step_metrics(self) -> dict[str, float]:
        """A step's ``sessions/`` metrics: opened, refused (429) and prefix breaks since the
        last call; open sessions and slots waiting for a client now."""
        since = {k: float(v - self._reported[k]) for k, v in self._counted.items()}
        self._reported = dict(self._counted)
        return {
            **{f"sessions/{k}": v for k, v in since.items()},
            "sessions/open": float(len(self._sessions)),
            "sessions/waiting": float(sum(len(m) for m in self._waiting.values())),
        }


def _ended(session_id: str) -> ChatCompletionError:
    return ChatCompletionError(
        f"session {session_id!r} has ended; open a new session",
        code="session_finished",
        status=409,
    )


def _fill(
    traj: Trajectory,
    chat: ChatSession,
    reward: float | None,
    turn_rewards: list[float] | None,
    state: Any,
    reason: str,
) -> None:
    """The collector's trajectory from the session's calls (an empty one if it made none)."""
    if chat.ledger.calls:
        done = chat.finish(
            reward if reward is not None else 0.0,
            turn_rewards=turn_rewards,
            end_state=state,
            end_reason=reason,
        )
        for field in ("samples", "reward", "turn_rewards", "turns", "policy_version"):
            setattr(traj, field, getattr(done, field))
        traj.turn_versions, traj.sampling = done.turn_versions, done.sampling
        traj.info.update(done.info)
    traj.end(state, reason)


__all__ = ["NoRoom", "OpenSession", "SessionBroker"]
