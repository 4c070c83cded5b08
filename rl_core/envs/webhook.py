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
requests are in flight; a circuit breaker holds calls off a failing server;
and the failure budget turns "many episodes failed" into a run failure
(`FailureBudgetExhausted`) instead of a run that trains on nothing.

The bytes travel through a `Transport` (`rl_core.envs.transport`; aiohttp
unless the constructor is given another): this module never sees a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

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
from rl_core.envs.resilience import CircuitBreaker, FailureBudget, backoff_s
from rl_core.envs.transport import (
    AddressRefused,
    AiohttpTransport,
    Answer,
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

_RETRYABLE_STATUS = frozenset({408, 425, 429})
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
        self._slots: asyncio.Semaphore | None = None

    # -- the Environment protocol ---------------------------------------------------------

    async def reset(self, episode_id: str, seed: int, config: Mapping[str, Any]) -> Reset:
        self._check_budget()
        self.budget.start()
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
        try:
            deadline = time.monotonic() + self.call_timeout_s * 2
            await self._call("close", wire.CloseRequest(episode_id=episode_id), deadline, retries=1)
        finally:
            self.budget.close(episode_id)

    def _parse(self, model: type[A], body: dict[str, Any], what: str) -> A:
        """``body`` as ``model``, or a `WebhookProtocolError` naming each wrong field."""
        try:
            return model.model_validate(body)
        except ValidationError as exc:
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
        raise DeferredTimeout(
            self.target.id,
            f"deferred result of {episode_id} step {step} did not arrive within "
            f"{self.policy.step_deadline_s}s (environment.webhook.step_deadline_s)",
        )

    async def _call(
        self, route: str, payload: BaseModel, deadline: float, *, retries: int | None = None
    ) -> tuple[int, dict[str, Any]]:
        """POST with retries; the status and decoded JSON body of the first good answer."""
        client, slots = self._bind()
        url = f"{self.target.url.rstrip('/')}/{route}"
        # Encoded once, as bytes: these are the bytes each attempt signs and sends.
        raw = payload.__pydantic_serializer__.to_json(payload)
        attempts = 1 + (self.policy.retries if retries is None else retries)
        failure = "no attempt made"
        made = 0
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                response = await self._attempt(client, slots, url, raw, remaining, failure)
            except AddressRefused as exc:  # policy, not the network: no retry, no breaker
                raise WebhookAddressRefused(
                    self.target.id, f"POST {url} was not sent: {exc}; not retried"
                ) from None
            except TimeoutError:
                failure = f"POST {url} timed out after {min(self.call_timeout_s, remaining):.3g}s"
                response = None
            except TransportError as exc:
                failure = f"POST {url} failed: {exc}"
                response = None
            made += 1
            retry_after: float | None = None
            if response is not None:
                status = response.status
                if status < 300:
                    self.breaker.record_success()
                    return status, _json(response, url, self.target.id)
                if status < 500 and status not in _RETRYABLE_STATUS:
                    self.breaker.record_success()  # it answered: the server is up
                    raise WebhookRejected(self.target.id, _rejection(response, url), status)
                failure = f"POST {url} answered {status}: {_reason(response)}"
                retry_after = _retry_after(response)
            self.breaker.record_failure()
            if attempt + 1 < attempts:
                delay = backoff_s(
                    attempt, self.policy.backoff_s, self.policy.backoff_max_s, self._rng
                )
                delay = max(delay, min(retry_after or 0.0, self.policy.backoff_max_s))
                if time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
        raise WebhookUnavailable(
            self.target.id, f"{failure} (gave up after {made} attempts, within the deadline)"
        )

    async def _attempt(
        self,
        client: Transport,
        slots: asyncio.Semaphore,
        url: str,
        raw: bytes,
        remaining: float,
        last_failure: str,
    ) -> Answer:
        """One request: wait for a slot (bounded by the deadline), ask the breaker, send."""
        try:
            async with asyncio.timeout(remaining):
                await slots.acquire()
        except TimeoutError:
            raise WebhookUnavailable(
                self.target.id,
                f"no request slot came free before the deadline (max_concurrency="
                f"{self.target.max_concurrency} requests are in flight)",
            ) from None
        try:
            # Asked only once a slot is held, so a half-open probe is a request that goes out.
            if not self.breaker.allow():
                raise CircuitOpen(
                    self.target.id,
                    f"circuit open after {self.breaker.consecutive_failures} consecutive "
                    f"failures; next probe in {self.breaker.retry_in_s():.1f}s "
                    f"(last: {last_failure})",
                )
            try:
                return await client.post(
                    url,
                    raw,
                    {"Content-Type": "application/json", HEADER: sign(self.target.secret, raw)},
                    min(self.call_timeout_s, remaining),
                )
            except (asyncio.CancelledError, AddressRefused):
                # A probe that was cancelled, or refused before it went out, gave no verdict
                # on the server: it must not hold the breaker half-open.
                self.breaker.abandon()
                raise
        finally:
            slots.release()

    def _bind(self) -> tuple[Transport, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._slots is None:
            self._loop = loop
            cap = self.target.max_concurrency
            self._client = self._make_transport(cap)
            self._slots = asyncio.Semaphore(cap)
        return self._client, self._slots


# -- the protocol's shapes --------------------------------------------------------------------


def _json(response: Answer, url: str, target_id: str) -> dict[str, Any]:
    try:
        body = json.loads(response.body)
    except ValueError:
        raise WebhookProtocolError(target_id, f"POST {url}: the answer is not JSON") from None
    if not isinstance(body, dict):
        raise WebhookProtocolError(target_id, f"POST {url}: the answer must be a JSON object")
    return body


_EXCERPT = 200


def _reason(response: Answer) -> str:
    """The server's own words when it answered with the protocol's error body (cut short,
    control characters dropped); otherwise only what kind of answer it was.

    Never the raw body: the error reaches the tenant, and a URL that now points somewhere
    else (a cloud metadata address, another internal service) must not be read back.
    """
    with contextlib.suppress(ValueError):
        body = json.loads(response.body)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "message" in error:
            message = "".join(c for c in str(error["message"]) if c.isprintable())
            return message[:_EXCERPT] + ("…" if len(message) > _EXCERPT else "")
    kind = response.headers.get("content-type", "no content type").split(";")[0]
    return (
        f"{response.reason or 'no reason'} ({kind}, {len(response.body)} bytes, "
        "not the protocol's error body)"
    )


def _rejection(response: Answer, url: str) -> str:
    hint = ""
    if response.status == 401:
        hint = "; check that the secret registered with rlaas is the one the server verifies with"
    return f"POST {url} was rejected with {response.status}: {_reason(response)}{hint}"


def _retry_after(response: Answer) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _messages(messages: Sequence[wire.Message]) -> list[Message]:
    # As the server wrote them, unknown fields included: they reach the chat template.
    return [m.model_dump(exclude_unset=True) for m in messages]


__all__ = ["CallbackSource", "MemoryCallbacks", "WebhookEnvironment", "WebhookTarget"]
