"""`SessionBroker`: where the collector's episodes meet the clients' sessions.

In a run whose environment is ``sessions`` the collector plays no environment: each
episode it starts is a **slot** that waits for a client (`SessionAgent.run_episode`).
The collector's admission is unchanged, so a slot is an episode in flight: at most
``rollout.concurrency`` of them, and none past the staleness bound. A client that opens
a session takes a waiting slot; when there is none it is told to come back
(`NoRoom`, HTTP 429 with Retry-After), which is the run's backpressure.

Groups: the collector starts ``group_size`` slots per task, and GRPO takes the
advantages of one group's episodes against each other. A client names the group a
session belongs to (any string, e.g. its task id); which slot a session takes is
`rl_core.sessions.slots.SlotBoard`'s to say. Unnamed sessions' advantages are taken
against unrelated tasks' (``algorithm.baseline: batch`` then says more).

A session ends when the client reports its reward (`end`), as ``cancelled`` when the
client gives it up (`cancel`: its agent failed), as ``timeout`` after
``rollout.episode_timeout_s`` from its opening (the client abandoned it), or as
``cancelled`` when the run stops. Each session has its own key (a bearer token) that
only opens that session.

Client faults (a session cancelled or timed out) are the client's, not the run's: the
session is recorded as it ended (never trained on, counted in ``sessions/client_faults``)
and its slot is **offered again** under a new session id (``<episode>-o<n>``, counted
in ``sessions/reoffered``), so its group still fills: the next unnamed session takes it
in an unnamed group, the next session of the group's name in a named one, within
``REOFFER_FILL_TIMEOUT_S`` (the name's client retries at once, or not at all; the group
holds its places meanwhile), after which it ends unfilled. A slot is offered at most
``REOFFERS_PER_SLOT`` times again; past that its last session's end is the episode's,
and the group trains without it (the collector's group rule). The run fails only when
``rollout.client_fault_budget`` sessions in a row (in the order they ended) ended
without a reward: `ClientFaults`, whose message says so. A run's end closes the
broker: from then on opening, and any call with a session's real key, answers 410
naming how the run ended.

Session keys are HMAC-SHA256 of the session id under the gateway's token (`sign_keys`),
URL-safe base64 without padding: whoever holds the token (the control plane) can tell a
session's real key after the gateway is gone, and answer "the run has ended" to it alone.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rl_core.agent.ledger import Trajectory
from rl_core.errors import ClientFaults
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
from rl_core.sessions.slots import Slot, SlotBoard

RETRY_AFTER_S = 1
# How long a named group's unclaimed members wait for the rest of its name's sessions.
GROUP_FILL_TIMEOUT_S = 120.0
# How long a named group's slot offered again waits for its name's next session: a client
# that retries does so at once, and until the slot ends its group holds its places.
REOFFER_FILL_TIMEOUT_S = 10.0
# How many more sessions a slot whose sessions keep failing is offered to. Bounded so a
# group whose task makes every client fail still ends (without that member).
REOFFERS_PER_SLOT = 8
DEFAULT_CLIENT_FAULT_BUDGET = 64  # rollout.client_fault_budget's default


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


Outcome = tuple[float, list[float] | None] | Literal["cancelled", "timeout"]


class SessionBroker:
    def __init__(
        self,
        *,
        engine: RolloutEngine,
        tokenizer: Tokenizer,
        config: SessionConfig,
        group_size: int,
        fill_timeout_s: float = GROUP_FILL_TIMEOUT_S,
        reoffer_timeout_s: float = REOFFER_FILL_TIMEOUT_S,
        client_fault_budget: int = DEFAULT_CLIENT_FAULT_BUDGET,
        episode_timeout_s: float | None = None,
        recorder: SpanRecorder | None = None,
    ) -> None:
        self.engine = engine
        self.recorder = recorder or SpanRecorder()
        self.tokenizer = tokenizer
        self.config = config
        self.group_size = group_size
        self.client_fault_budget = client_fault_budget
        self.episode_timeout_s = episode_timeout_s  # only named in the budget's message
        self.slots = SlotBoard(
            group_size=group_size,
            fill_timeout_s=fill_timeout_s,
            reoffer_timeout_s=reoffer_timeout_s,
        )
        self._sessions: dict[str, OpenSession] = {}
        self._counted: dict[str, int] = {
            "opened": 0,
            "refused": 0,
            "prefix_breaks": 0,
            "unfilled": 0,
            "client_faults": 0,
            "reoffered": 0,
        }
        # Sessions in a row (as they ended) that ended without a reward, by end state.
        self._streak: collections.Counter[str] = collections.Counter()
        # The run's failure once the streak reached the budget: episodes still being played
        # then end with the same error, not with a longer streak's.
        self._spent: ClientFaults | None = None
        # Sessions ended by a client fault whose slot was offered again: recorded, never
        # trained on; the pipeline drains them with the episodes that ended (`drain_faulted`).
        self._faulted: list[Trajectory] = []
        self._key_secret = secrets.token_bytes(32)
        self._closed: str | None = None  # how the run ended, once it has
        # Set (and replaced) whenever a slot starts waiting: wakes clients waiting to open.
        self._slot_offered = asyncio.Event()
        self._reported = dict(self._counted)

    def sign_keys(self, secret: str) -> None:
        """Derive session keys from ``secret`` (the gateway's token; module docstring)."""
        self._key_secret = secret.encode()

    def session_key(self, session_id: str) -> str:
        mac = hmac.new(self._key_secret, session_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def close(self, how: str) -> None:
        """The run has ended (``how``: e.g. "finished its steps"; the first word stays):
        no more sessions."""
        if self._closed is None:
            self._closed = how
        self._slot_offered.set()  # clients waiting to open hear it at once

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
        """Offer ``traj``'s episode to clients and fill it from the session that ends it:
        the first that ends with a reward, or the last a client fault ended (module
        docstring). ``traj.episode_id`` becomes that session's id."""
        first_id = traj.episode_id
        try:
            for offer in range(REOFFERS_PER_SLOT + 1):
                traj.episode_id = f"{first_id}-o{offer}" if offer else first_id
                session = await self._offer(traj, reoffered=offer > 0)
                if session is None:
                    return  # unfilled: ended by `_offer`
                traj.started = session.opened
                traj.enter("client")
                try:
                    outcome = await self._outcome(session, timeout_s)
                except asyncio.CancelledError:  # the run stops: keep what the session did
                    _fill(traj, session.chat, None, None, "cancelled", "cancelled")
                    self._record_span(session, "cancelled", traj.turns)
                    raise
                finally:
                    self.slots.session_over(traj.group)
                again = isinstance(outcome, str) and offer < REOFFERS_PER_SLOT
                self._settle(traj, session, outcome, reoffer=again)
                if not again:
                    return
                self._counted["reoffered"] += 1  # its group needs a session again
        finally:
            self.slots.member_ended(traj.group)

    async def _offer(self, traj: Trajectory, *, reoffered: bool) -> OpenSession | None:
        """Wait for a client to open a session as ``traj.episode_id``; None (``traj``
        ended) when its group's name never sent the session."""
        loop = asyncio.get_running_loop()
        slot = Slot(traj.episode_id, traj.group, traj.member, loop.create_future(), reoffered)
        traj.enter("waiting_client")
        try:
            async with asyncio.timeout(None) as slot.wait:
                self.slots.add(slot)
                self._slot_offered.set()
                self._slot_offered = asyncio.Event()
                session: OpenSession = await slot.claimed
                return session
        except TimeoutError:
            if slot.claimed.done() and not slot.claimed.cancelled():
                claimed: OpenSession = slot.claimed.result()  # as the deadline passed
                return claimed
            # Its group's name never sent this many sessions: the member ends unplayed and
            # the group trains without it (as with a failed episode), freeing its place.
            self._counted["unfilled"] += 1
            traj.end("cancelled", "group_not_filled")
            return None
        except asyncio.CancelledError:
            if slot.claimed.done() and not slot.claimed.cancelled():
                # Claimed as the run stopped, before this task woke: never played.
                lost: OpenSession = slot.claimed.result()
                lost.ended.cancel()
                self._sessions.pop(lost.session_id, None)
                self.slots.session_over(slot.group)
            raise
        finally:
            self.slots.remove(slot)

    async def _outcome(self, session: OpenSession, timeout_s: float | None) -> Outcome:
        """How the client ended ``session``: its reward, ``cancelled`` or ``timeout``."""
        try:
            async with asyncio.timeout(timeout_s):
                outcome = await asyncio.shield(session.ended)
        except TimeoutError:
            session.ended.cancel()
            return "timeout"
        except asyncio.CancelledError:
            session.ended.cancel()
            raise
        finally:
            self._sessions.pop(session.session_id, None)
        return "cancelled" if outcome is None else outcome

    def _settle(
        self, slot: Trajectory, session: OpenSession, outcome: Outcome, *, reoffer: bool
    ) -> None:
        """Fill the slot's trajectory from the session, or a record of the session's own
        when its slot is offered again; count a fault, failing the run past the budget."""
        into = slot
        if reoffer:
            into = Trajectory(episode_id=session.session_id, group=slot.group, member=slot.member)
            into.started = session.opened
            self._faulted.append(into)
        if outcome == "timeout":
            _fill(into, session.chat, None, None, "timeout", "episode_timeout")
        elif outcome == "cancelled":
            _fill(into, session.chat, None, None, "cancelled", "client_cancelled")
        else:
            _fill(into, session.chat, *outcome, "done", "client_done")
            self._counted["prefix_breaks"] += len(session.chat.ledger.breaks)
        self._record_span(session, into.end_state, into.turns)
        if not isinstance(outcome, str):
            self._streak.clear()
            return
        self._counted["client_faults"] += 1
        if self._spent is not None:  # another episode spent the budget: the run is failing
            raise ClientFaults(str(self._spent))
        self._streak[outcome] += 1
        if self._streak.total() >= self.client_fault_budget:
            self._spent = self._budget_spent()
            self.close(f"failed ({type(self._spent).__name__}: {self._spent})")
            raise self._spent

    def _budget_spent(self) -> ClientFaults:
        timeout = (
            f" after rollout.episode_timeout_s ({self.episode_timeout_s:g} s)"
            if self.episode_timeout_s
            else ""
        )
        return ClientFaults(
            f"{self._streak.total()} sessions in a row ended without a reward "
            f"({self._streak['cancelled']} cancelled by their client, "
            f"{self._streak['timeout']} left open until they timed out{timeout}): the "
            "clients are failing their episodes (see the cancelled and timed-out sessions "
            "in the run's trajectories and sessions/client_faults). Fix the client, or "
            f"raise rollout.client_fault_budget (now {self.client_fault_budget})"
        )

    def _record_span(self, session: OpenSession, end_state: str, turns: int = 0) -> None:
        self.recorder.add(
            "rollout",
            start_us=session.opened_us,
            dur_us=now_us() - session.opened_us,
            track=f"episode/{session.session_id}",
            step=self.engine.policy_version,
            args={"end_state": end_state, "turns": turns or len(session.chat.ledger.calls)},
        )

    def drain_faulted(self) -> list[Trajectory]:
        """Sessions a client fault ended whose slot was offered again, since the last call."""
        out, self._faulted = self._faulted, []
        return out

    # -- the clients' side ---------------------------------------------------------------

    async def open(self, group: str | None = None, *, wait_s: float = 0.0) -> OpenSession:
        """A new session in the named group (see the module docstring), waiting up to
        ``wait_s`` for a free episode; `NoRoom` if none came, 410 once the run has ended.

        Waiting here rather than in the client: a client told 429 comes back after
        whole seconds (Retry-After), while a slot offered now is taken at once, so the
        run's episodes do not sit idle between a client's retries.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while True:
            if self._closed is not None:
                raise _run_ended(self._closed)
            slot = self.slots.take(group)
            if slot is not None:
                break
            offered = self._slot_offered
            try:
                async with asyncio.timeout_at(deadline):
                    await offered.wait()
            except TimeoutError:
                self._counted["refused"] += 1
                raise NoRoom() from None
        chat = ChatSession(
            slot.session_id, engine=self.engine, tokenizer=self.tokenizer, config=self.config
        )
        session = OpenSession(
            session_id=slot.session_id,
            key=self.session_key(slot.session_id),
            chat=chat,
            ended=asyncio.get_running_loop().create_future(),
        )
        self._sessions[session.session_id] = session
        slot.claimed.set_result(session)
        self._counted["opened"] += 1
        return session

    def session(self, session_id: str, key: str) -> OpenSession:
        """The open session ``session_id`` if ``key`` is its key; 404 otherwise (a wrong key
        and an unknown session look the same, so keys cannot be probed for ids), or 410
        for a session's real key once the run has ended."""
        if self._closed is not None and hmac.compare_digest(
            self.session_key(session_id).encode(), key.encode()
        ):
            raise _run_ended(self._closed)
        session = self._sessions.get(session_id)
        if session is not None and hmac.compare_digest(session.key.encode(), key.encode()):
            return session
        raise ChatCompletionError(
            f"no open session {session_id!r} for this key: it ended, timed out, or the "
            "key is another session's. Open a new session",
            code="session_not_found",
            status=404,
        )

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
        """A step's ``sessions/`` metrics: opened, refused (429), prefix breaks, unfilled
        members, client faults and slots offered again since the last call; open
        sessions, slots waiting for a client and the client-fault streak now."""
        since = {k: float(v - self._reported[k]) for k, v in self._counted.items()}
        self._reported = dict(self._counted)
        return {
            **{f"sessions/{k}": v for k, v in since.items()},
            "sessions/open": float(len(self._sessions)),
            "sessions/waiting": float(self.slots.waiting),
            "sessions/fault_streak": float(self._streak.total()),
        }


def _ended(session_id: str) -> ChatCompletionError:
    return ChatCompletionError(
        f"session {session_id!r} has ended; open a new session",
        code="session_finished",
        status=409,
    )


def _run_ended(how: str) -> ChatCompletionError:
    return ChatCompletionError(
        f"the run has ended: it {how}; its sessions are over. Open no more sessions of it",
        code="run_ended",
        status=410,
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


__all__ = ["REOFFERS_PER_SLOT", "NoRoom", "OpenSession", "SessionBroker"]
