"""`WebhookEnvironment`: the client side of the environment webhook protocol (v1).

Every request is signed (`rl_core.protocol.signing`). A call that fails for
a reason a retry can fix (connection error, timeout, 5xx, 408/425/429) is
retried with exponential backoff and jitter, within the step's deadline; a
step is safe to retry because the server keys it by ``(episode_id, step)``.
A 4xx answer is the server telling us something is wrong with the request
(a bad signature, an unknown config key): retrying cannot help, so it fails
at once with the server's reason; so does a connection the transport refused
because the host is, or now resolves to, an address the target's allowlist
does not allow (`WebhookAddressRefused`). A ``202 {"deferred": true}`` step
waits on the `CallbackSource` until the deadline. At most ``max_concurrency``
requests are in flight, fewer while the server shows signs of overload (the
AIMD limit of `rl_core.envs.adaptive`: a timeout, no connection, a reset, a
429/503 lowers it, successes raise it again); an overload that lowered the limit
is retried without counting as a failure. A circuit breaker holds calls off a
failing server; and the failure budget turns "many episodes failed" into a run
failure (`FailureBudgetExhausted`) instead of a run that trains on nothing.
Every failed request is counted by reason (`FAULT_REASONS`); `step_metrics`
reports them, the limit and the breaker's moves as ``env/`` metrics.

The bytes travel through a `Transport` (`rl_core.envs.transport`; aiohttp
unless the constructor is given another): this module never sees a socket.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rl_core.envs.adaptive import AdaptiveSlots, AimdLimit
from rl_core.envs.base import Action, Message, Reset, Step
from rl_core.envs.callbacks import CallbackSource, MemoryCallbacks
from rl_core.envs.errors import (
    CircuitOpen,
    DeferredTimeout,
    FailureBudgetExhausted,
    WebhookAddressRefused,
    WebhookError,
    WebhookProtocolError,
    WebhookRejected,
    WebhookUnavailable,
)
from rl_core.envs.faults import (
    ABSORBED_MAX,
    FAULT_REASONS,
    OVERLOAD_KINDS,
    OVERLOAD_STATUS,
    RETRYABLE_STATUS,
    reason,
    rejection,
    retry_after,
)
from rl_core.envs.resilience import CircuitBreaker, FailureBudget, backoff_s
from rl_core.envs.transport import (
    AddressRefused,
    AiohttpTransport,
    Answer,
    AnswerTooLarge,
    Transport,
    TransportError,
    TransportFactory,
)
from rl_core.protocol import webhook as wire
from rl_core.protocol.addresses import OWN_MACHINE, Allowlist
from rl_core.protocol.signing import HEADER, sign
from rl_core.spec import WebhookCallSpec

log = logging.getLogger(__name__)
A = TypeVar("A", bound=BaseModel)

CALLBACK_POLL_S = 25.0  # one long-poll of the CallbackSource; the loop runs to the deadline


@dataclasses.dataclass(frozen=True)
class WebhookTarget:
    """A registered environment, as the claim answer hands it to the worker.

    ``allowlist`` is where its URL may lead, checked at every connection: the worker
    passes the operator's ``RLAAS_ENV_URL_ALLOWLIST`` (``public`` on a server). The
    default is for a run on one's own machine, with no server (rl_core as a library):
    public, loopback and private addresses, never link-local or metadata ones.
    """

    id: str
    url: str
    secret: str = dataclasses.field(repr=False)
    timeout_s: float = 30.0
    max_concurrency: int = 64
    allowlist: Allowlist = OWN_MACHINE


class WebhookEnvironment:
    """One per run; serves all of its episodes concurrently."""

    def __init__(
        self,
        target: WebhookTarget,
        *,
        callbacks: CallbackSource | None = None,
        policy: WebhookCallSpec | None = None,
        seed: int = 0,
        transport: TransportFactory | None = None,
    ) -> None:
        self.target = target
        self.callbacks = callbacks
        self.policy = policy or WebhookCallSpec()
        self.call_timeout_s = self.policy.timeout_s or target.timeout_s
        self.breaker = CircuitBreaker(self.policy.breaker_failures, self.policy.breaker_cooldown_s)
        self.budget = FailureBudget(self.policy.failure_budget, self.policy.failure_budget_min)
        self._rng = random.Random(seed)
        # The client and semaphore belong to one event loop; made on first use. A transport
        # given here is trusted to check addresses itself (tests, benchmarks).
        self._make_transport = transport or functools.partial(
            AiohttpTransport, allowlist=target.allowlist
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Transport | None = None
        self._slots: AdaptiveSlots | None = None
        self.faults: Counter[str] = Counter()  # failed requests by reason (FAULT_REASONS)
        self.absorbed = 0  # overloads retried uncounted, because the limit was lowered
        self._reported: dict[str, int] = {}
        # Episodes whose /reset was sent (or about to be): each gets one /close, and only
        # they do; an episode refused before its reset went out has nothing to close.
        self._opened: set[str] = set()
        # Resolved at the breaker's next verdict (a probe's end): what held calls wait on.
        self._verdict: asyncio.Future[None] | None = None

    # -- the Environment protocol ---------------------------------------------------------

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        self._check_budget()
        self.budget.start()
        self._opened.add(episode_id)
        payload = wire.ResetRequest(episode_id=episode_id, seed=seed, config=dict(config))
        body = await self._episode_call(episode_id, "reset", payload, self.policy.step_deadline_s)
        answer = self._parse(wire.ResetAnswer, body, f"{episode_id}: the /reset answer")
        return Reset(messages=_messages(answer.messages), tools=answer.tools, info=answer.info)

    async def step(self, episode_id: str, step: int, action: Action) -> Step:
        self._check_budget()
        payload = wire.StepRequest(
            episode_id=episode_id,
            step=step,
            action=wire.Action(
                content=action.content,
                tool_calls=[wire.ToolCall(**dataclasses.asdict(c)) for c in action.tool_calls],
            ),
        )
        body = await self._episode_call(
            episode_id, "step", payload, self.policy.step_deadline_s, step=step
        )
        answer = self._parse(wire.StepAnswer, body, f"{episode_id}: the answer to step {step}")
        return Step(
            messages=_messages(answer.messages),
            reward=answer.reward,
            done=answer.done,
            info=answer.info,
        )

    async def close(self, episode_id: str) -> None:
        if episode_id not in self._opened:  # its reset was never sent (the budget ran out)
            self.budget.close(episode_id)
            return
        self._opened.discard(episode_id)
        try:
            deadline = time.monotonic() + self.call_timeout_s * 2
            await self._call("close", wire.CloseRequest(episode_id=episode_id), deadline, retries=1)
        finally:
            self.budget.close(episode_id)

    async def call(self, route: str, payload: BaseModel, answer: type[A], deadline_s: float) -> A:
        """One signed request to ``{url}/{route}`` outside any episode (the ``webhook``
        verifier's ``/score``), with this client's retries, breaker, concurrency limit and
        fault counts; its 200 answer as ``answer``. Not counted against the failure budget:
        a call that fails fails the caller's episode, which the budget counts there."""
        deadline = time.monotonic() + deadline_s
        status, body = await self._call(route, payload, deadline)
        if status != 200:
            self.faults["protocol"] += 1
            raise WebhookProtocolError(
                self.target.id, f"/{route} answered {status}; it must answer 200 with its result"
            )
        return self._parse(answer, body, f"the /{route} answer")

    def _parse(self, model: type[A], body: dict[str, Any], what: str) -> A:
        """``body`` as ``model``, or a `WebhookProtocolError` naming each wrong field."""
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            self.faults["protocol"] += 1
            raise WebhookProtocolError(
                self.target.id,
                f"{what} is not protocol {wire.VERSION}: {wire.problems(exc)} "
                "(docs/environment-protocol.md)",
            ) from None

    async def aclose(self) -> None:
        """Close the HTTP client, in the loop that used it (the pipeline does, as its run
        ends; an unclosed `AiohttpTransport` would still close itself as that loop shuts
        down)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- calls ----------------------------------------------------------------------------

    def _check_budget(self) -> None:
        b = self.budget
        if b.exhausted:
            raise FailureBudgetExhausted(
                self.target.id, b.failed, b.started, b.allowed, b.last_error
            )

    async def _episode_call(
        self,
        episode_id: str,
        route: str,
        payload: BaseModel,
        deadline_s: float,
        *,
        step: int | None = None,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + deadline_s
        try:
            status, body = await self._call(route, payload, deadline)
            if status == 202 and route != "step":
                raise WebhookProtocolError(
                    self.target.id, f"/{route} answered 202; only /step may defer its result"
                )
            if status == 202 and step is not None:
                self._parse(
                    wire.DeferredAnswer, body, f"{episode_id}: the 202 answer to step {step}"
                )
                body = await self._await_deferred(episode_id, step, deadline)
            return body
        except WebhookError as exc:
            self.budget.fail(episode_id, str(exc))
            log.warning("episode %s: %s", episode_id, exc)
            self._check_budget()
            raise

    async def _await_deferred(self, episode_id: str, step: int, deadline: float) -> dict[str, Any]:
        if self.callbacks is None:
            raise WebhookProtocolError(
                self.target.id,
                "step answered 202 (deferred) but this run has no callback source to receive "
                "the result; answer synchronously or run through the control plane",
            )
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                result = await self.callbacks.wait(
                    episode_id, step, min(remaining, CALLBACK_POLL_S)
                )
            except Exception as exc:  # the relay itself failed: infrastructure
                raise WebhookUnavailable(
                    self.target.id, f"waiting for the deferred result failed: {exc!r}"
                ) from exc
            if result is not None:
                try:
                    answer = wire.parse_callback(dict(result))
                except ValidationError as exc:
                    self.faults["protocol"] += 1
                    raise WebhookProtocolError(
                        self.target.id,
                        f"{episode_id}: the deferred result of step {step} is not protocol "
                        f"{wire.VERSION}: {wire.problems(exc)} (docs/environment-protocol.md)",
                    ) from None
                if isinstance(answer, wire.ErrorAnswer):  # the step failed after it deferred
                    raise WebhookUnavailable(
                        self.target.id,
                        f"deferred step {step} of {episode_id} failed: {answer.error.message}",
                    )
                return dict(result)
        self.faults["deferred_timeout"] += 1
        raise DeferredTimeout(
            self.target.id,
            f"deferred result of {episode_id} step {step} did not arrive within "
            f"{self.policy.step_deadline_s}s (environment.webhook.step_deadline_s)",
        )

    async def _call(
        self, route: str, payload: BaseModel, deadline: float, *, retries: int | None = None
    ) -> tuple[int, dict[str, Any]]:
        """POST with retries; the status and decoded JSON body of the first good answer.

        ``retries`` counts failed attempts; an overload answered by lowering the
        concurrency limit (`_Outcome.absorbed`) is retried without using one, at most
        `ABSORBED_MAX` times; the deadline bounds all of them.
        """
        client, slots = self._bind()
        url = f"{self.target.url.rstrip('/')}/{route}"
        # Encoded once, as bytes: these are the bytes each attempt signs and sends.
        raw = payload.__pydantic_serializer__.to_json(payload)
        attempts = 1 + (self.policy.retries if retries is None else retries)
        failure = "no attempt made"
        made = failed = absorbed = 0
        held = False  # the last failed attempt was a probe that failed while this call waited
        while failed < attempts:
            held = await self._wait_out_breaker(deadline, failure)
            if held:
                failed += 1
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                outcome = await self._attempt(
                    client, slots, url, raw, remaining, failure, absorb=absorbed < ABSORBED_MAX
                )
            except _HeldOff:  # another call is the breaker's probe: wait for its verdict
                continue
            except AddressRefused as exc:  # policy, not the network: no retry, no breaker
                self.faults["address_refused"] += 1
                raise WebhookAddressRefused(
                    self.target.id, f"POST {url} was not sent: {exc}; not retried"
                ) from None
            made += 1
            answer = outcome.answer
            if answer is not None and answer.status < 300:
                return answer.status, self._json(answer, url)
            if answer is not None and not outcome.failure:  # a 3xx or 4xx: not retried
                raise WebhookRejected(self.target.id, rejection(answer, url), answer.status)
            failure = outcome.failure
            if outcome.absorbed:
                absorbed += 1
            else:
                failed += 1
                if failed >= attempts:
                    break
            delay = backoff_s(made - 1, self.policy.backoff_s, self.policy.backoff_max_s, self._rng)
            asked = retry_after(answer) if answer is not None else None
            delay = max(delay, min(asked or 0.0, self.policy.backoff_max_s))
            if time.monotonic() + delay >= deadline:
                break
            await asyncio.sleep(delay)
        if held:
            self.faults["circuit_open"] += 1
            raise CircuitOpen(
                self.target.id,
                f"circuit open after {self.breaker.consecutive_failures} consecutive "
                f"failures; a probe failed while the call waited, its last attempt (last: "
                f"{failure})",
            )
        lowered = f", {absorbed} retried after lowering the concurrency limit" if absorbed else ""
        raise WebhookUnavailable(
            self.target.id,
            f"{failure} (gave up after {made} attempts{lowered}, within the deadline)",
        )

    async def _attempt(
        self,
        client: Transport,
        slots: AdaptiveSlots,
        url: str,
        raw: bytes,
        remaining: float,
        last_failure: str,
        *,
        absorb: bool,
    ) -> _Outcome:
        """One request: wait for a permit (bounded by the deadline), ask the breaker, send;
        then settle the permit, the breaker and the fault counts by what came back."""
        try:
            async with asyncio.timeout(remaining):
                epoch = await slots.acquire()
        except TimeoutError:
            limit = slots.limit
            raise WebhookUnavailable(
                self.target.id,
                f"no request slot came free before the deadline ({limit.in_flight} requests "
                f"in flight, the limit now {limit.permits} of max_concurrency="
                f"{self.target.max_concurrency})",
            ) from None
        try:
            answer, kind, failure = await self._send(client, url, raw, remaining, last_failure)
        except BaseException:
            slots.ended(epoch)
            raise
        status = answer.status if answer is not None else None
        overload = kind in OVERLOAD_KINDS or status in OVERLOAD_STATUS
        if (
            answer is not None
            and not overload
            and (answer.status < 500)
            and (answer.status not in RETRYABLE_STATUS)
        ):
            # It answered: the server is up, whatever it said.
            if answer.status < 300:
                slots.succeeded(epoch)
            else:
                slots.ended(epoch)
                self.faults["redirect" if answer.status < 400 else "status_refused"] += 1
            self._breaker_verdict(True)
            return _Outcome(answer, "")
        if answer is not None:
            kind = "status_overload" if overload else "status_error"
            failure = f"POST {url} answered {answer.status}: {reason(answer)}"
        self.faults[kind] += 1
        if overload:
            if slots.overloaded(epoch) == "absorbed" and absorb:
                self.absorbed += 1
                self._breaker_verdict(None)  # busy is not down: no verdict for the breaker
                return _Outcome(answer, failure, absorbed=True)
        else:
            slots.ended(epoch)
        self._breaker_verdict(False)
        return _Outcome(answer, failure)

    async def _send(
        self, client: Transport, url: str, raw: bytes, remaining: float, last_failure: str
    ) -> tuple[Answer | None, str, str]:
        """Ask the breaker, then POST: the answer, or None with the kind of failure and
        what it was."""
        # Asked only once a permit is held, so a half-open probe is a request that goes out.
        if not self.breaker.allow():
            raise _HeldOff
        timeout_s = min(self.call_timeout_s, remaining)
        try:
            answer = await client.post(
                url,
                raw,
                {"Content-Type": "application/json", HEADER: sign(self.target.secret, raw)},
                timeout_s,
            )
        except (asyncio.CancelledError, AddressRefused):
            # A probe that was cancelled, or refused before it went out, gave no verdict
            # on the server: it must not hold the breaker half-open.
            self._breaker_verdict(None)
            raise
        except TimeoutError:
            return None, "timeout", f"POST {url} timed out after {timeout_s:.3g}s"
        except AnswerTooLarge as exc:  # it answered; the same request would get the same
            self._breaker_verdict(True)
            self.faults["too_large"] += 1
            raise WebhookProtocolError(self.target.id, f"POST {url}: {exc}; not retried") from None
        except TransportError as exc:
            return None, exc.kind, f"POST {url} failed: {exc}"
        return answer, "", ""

    async def _wait_out_breaker(self, deadline: float, last_failure: str) -> bool:
        """Return once the breaker lets calls through (at once, when it is closed); True
        when a probe failed meanwhile, which the caller counts as one failed attempt.

        While it is open a call waits, rather than failing its episode: the collector
        would start new episodes as fast as they failed, and one cool-down would fail
        every episode it could start (604 of 671 in tests/faults/test_mix.py). After the
        cool-down one call goes out as the probe and the rest wait for its verdict: a
        success lets them go; a failure opens the breaker again and costs each waiting
        call one of its attempts. So an outage shorter than the cool-down costs no
        episode, and a dead server fails an episode after ``retries + 1`` cool-downs.
        A call whose deadline comes while it waits fails with `CircuitOpen`.
        """
        breaker = self.breaker
        opened = breaker.opened
        while breaker.holds_calls() and breaker.opened == opened:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.faults["circuit_open"] += 1
                raise CircuitOpen(
                    self.target.id,
                    f"circuit open after {breaker.consecutive_failures} consecutive failures; "
                    f"the call waited for it until the deadline (last: {last_failure})",
                )
            wait = breaker.retry_in_s() if breaker.state == "open" else remaining
            await asyncio.wait([self._next_verdict()], timeout=min(wait, remaining))
        return breaker.opened != opened

    def _next_verdict(self) -> asyncio.Future[None]:
        if self._verdict is None or self._verdict.done():
            self._verdict = asyncio.get_running_loop().create_future()
        return self._verdict

    def _breaker_verdict(self, success: bool | None) -> None:
        """Tell the breaker how a request it let through ended (None: no verdict, it was
        cancelled or is being retried after an overload), and wake the calls it holds."""
        if success is None:
            self.breaker.abandon()
        elif success:
            self.breaker.record_success()
        else:
            self.breaker.record_failure()
        if self._verdict is not None and not self._verdict.done():
            self._verdict.set_result(None)

    def _json(self, response: Answer, url: str) -> dict[str, Any]:
        try:
            body = json.loads(response.body)
        except ValueError:
            self.faults["protocol"] += 1
            raise WebhookProtocolError(
                self.target.id, f"POST {url}: the answer is not JSON"
            ) from None
        if not isinstance(body, dict):
            self.faults["protocol"] += 1
            raise WebhookProtocolError(
                self.target.id, f"POST {url}: the answer must be a JSON object"
            )
        return body

    def _bind(self) -> tuple[Transport, AdaptiveSlots]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._slots is None:
            self._loop = loop
            cap = self.target.max_concurrency
            self._client = self._make_transport(cap)
            self._slots = AdaptiveSlots(AimdLimit(cap))
        return self._client, self._slots

    # -- metrics --------------------------------------------------------------------------

    def step_metrics(self) -> dict[str, float]:
        """A step's ``env/`` metrics (the pipeline reads them once per step): failed requests
        by reason, overloads retried uncounted, limit cuts, breaker openings and closings
        since the last call; the concurrency limit now and its lowest since the last call;
        whether the breaker is open now."""
        limit = self._slots.limit if self._slots is not None else None
        counts = {
            **{f"faults/{reason}": self.faults[reason] for reason in FAULT_REASONS},
            "overloads_absorbed": self.absorbed,
            "limit_cuts": limit.cuts if limit is not None else 0,
            "breaker_opened": self.breaker.opened,
            "breaker_closed": self.breaker.closed,
        }
        since = {k: float(v - self._reported.get(k, 0)) for k, v in counts.items()}
        self._reported = counts
        cap = self.target.max_concurrency
        return {
            **{f"env/{k}": v for k, v in since.items()},
            "env/concurrency_limit": float(limit.permits if limit is not None else cap),
            "env/concurrency_limit_min": float(limit.take_lowest() if limit is not None else cap),
            "env/breaker_open": float(self.breaker.state != "closed"),
        }


class _HeldOff(Exception):
    """The breaker refused this request: another call holds its one half-open probe."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """One attempt's end, as `_call` needs it: the answer if one came, what failed
    ("" when nothing did), and whether the failure was an overload answered by lowering
    the concurrency limit (retried without counting)."""

    answer: Answer | None
    failure: str
    absorbed: bool = False


# -- the protocol's shapes --------------------------------------------------------------------


def _messages(messages: Sequence[wire.Message]) -> list[Message]:
    # As the server wrote them, unknown fields included: they reach the chat template.
    return [m.model_dump(exclude_unset=True) for m in messages]


__all__ = [
    "FAULT_REASONS",
    "CallbackSource",
    "MemoryCallbacks",
    "WebhookEnvironment",
    "WebhookTarget",
]
