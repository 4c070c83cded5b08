"""WebhookEnvironment against sdk.envserver over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from typing import Any

import pytest

from rl_core.envs import Action, MemoryCallbacks, ToolCall
from rl_core.envs.calculator import Calculator
from rl_core.envs.errors import (
    CircuitOpen,
    DeferredTimeout,
    FailureBudgetExhausted,
    WebhookProtocolError,
    WebhookRejected,
    WebhookUnavailable,
)
from rl_core.envs.resilience import CircuitBreaker, FailureBudget, backoff_s
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import WebhookCallSpec
from sdk.envserver import EnvServer
from tests.sdk.serving import SECRET, Counted, Scripted, free_port, relay_app, serving

FAST = {"backoff_s": 0.01, "backoff_max_s": 0.05}
# The servers here are on loopback: say so, rather than lean on the own-machine default.
LOOPBACK = Allowlist.parse("loopback", embedded=False)


def client(
    url: str, *, secret: str = SECRET, concurrency: int = 8, **policy: Any
) -> WebhookEnvironment:
    target = WebhookTarget(
        id="env_t",
        url=url,
        secret=secret,
        timeout_s=5.0,
        max_concurrency=concurrency,
        allowlist=LOOPBACK,
    )
    callbacks = policy.pop("callbacks", None)
    return WebhookEnvironment(
        target, callbacks=callbacks, policy=WebhookCallSpec(**{**FAST, **policy})
    )


def test_an_episode_over_http_with_a_builtin_behind_the_sdk_server() -> None:
    async def main(url: str) -> None:
        env = client(url)
        reset = await env.reset("e1", 5, {"difficulty": "easy"})
        assert reset.tools[0]["function"]["name"] == "calculator"
        problem = reset.info["problem"]
        call = ToolCall("t1_0", "calculator", {"expression": problem})
        tool = await env.step("e1", 1, Action(content="", tool_calls=(call,)))
        assert tool.messages[0]["content"] == str(reset.info["answer"]) and not tool.done
        final = await env.step("e1", 2, Action(content=str(reset.info["answer"])))
        assert (final.done, final.reward) == (True, 1.0)
        await env.close("e1")
        await env.aclose()

    with serving(EnvServer(Calculator(), secret=SECRET).app) as url:
        asyncio.run(main(url))


def test_5xx_is_retried_with_backoff_and_the_step_applied_once() -> None:
    env_side = Scripted(fail_steps=2)

    async def main(url: str) -> Any:
        env = client(url, retries=3)
        await env.reset("e", 0, {})
        return await env.step("e", 1, Action(content="x"))

    with serving(EnvServer(env_side, secret=SECRET).app) as url:
        step = asyncio.run(main(url))
    assert step.reward == 1.0 and env_side.applied[("e", 1)] == 1


def test_a_timed_out_step_is_retried_and_gets_the_first_calls_result() -> None:
    env_side = Scripted(step_delays=[0.6])  # the first call outlives the client's timeout
    app = Counted(EnvServer(env_side, secret=SECRET).app)

    async def main(url: str) -> Any:
        env = client(url, retries=5, timeout_s=0.25)
        await env.reset("e", 0, {})
        return await env.step("e", 1, Action(content="x"))

    with serving(app) as url:
        step = asyncio.run(main(url))
    assert app.requests["/step"] >= 2  # it was retried...
    assert step.info["applied"] == 1 and env_side.applied[("e", 1)] == 1  # ...and applied once


def test_timeouts_without_retries_fail_the_episode_as_an_environment_failure() -> None:
    async def main(url: str) -> None:
        # One request at a time: the concurrency limit is at its floor, so a timeout is a
        # failure (above it, it would lower the limit and be retried: test_faults_limit).
        env = client(url, retries=0, timeout_s=0.1, concurrency=1)
        await env.reset("e", 0, {})
        with pytest.raises(WebhookUnavailable, match=r"timed out after 0\.1s") as info:
            await env.step("e", 1, Action(content="x"))
        assert isinstance(info.value, EnvironmentFailure)
        assert env.budget.failed == 1

    with serving(EnvServer(Scripted(step_delays=[0.5]), secret=SECRET).app) as url:
        asyncio.run(main(url))


def test_a_wrong_secret_is_rejected_once_not_retried() -> None:
    env_side = Scripted()
    app = Counted(EnvServer(env_side, secret=SECRET).app)

    async def main(url: str) -> None:
        env = client(url, secret="not-the-right-secret", retries=3)
        with pytest.raises(WebhookRejected, match=r"401.*secret registered") as info:
            await env.reset("e", 0, {})
        assert info.value.status == 401
        assert env.breaker.state == "closed"  # the server answered: it is up

    with serving(app) as url:
        asyncio.run(main(url))
    assert app.requests["/reset"] == 1 and env_side.resets == 0


def test_deferred_steps_wait_for_the_relayed_callback() -> None:
    callbacks = MemoryCallbacks()
    env_side = Scripted(step_delays=[0.3, 5.0])

    async def main(url: str) -> None:
        env = client(url, callbacks=callbacks, step_deadline_s=2.0)
        await env.reset("e", 0, {})
        step = await env.step("e", 1, Action(content="slow"))
        assert step.messages == [{"role": "user", "content": "you said slow"}]
        late = client(url, callbacks=callbacks, step_deadline_s=0.3)
        await late.reset("f", 0, {})
        with pytest.raises(DeferredTimeout, match="step_deadline_s"):
            await late.step("f", 1, Action(content="too slow"))
        blind = client(url)  # no callback source: a 202 cannot be waited for
        await blind.reset("g", 0, {})
        env_side.step_delays.append(0.5)
        with pytest.raises(WebhookProtocolError, match="no callback source"):
            await blind.step("g", 1, Action(content="x"))
        await env.reset("h", 0, {})
        env_side.step_delays.append(0.3)
        env_side.fail_late = 1
        with pytest.raises(WebhookUnavailable, match="failed: scripted late failure"):
            await env.step("h", 1, Action(content="x"))

    with serving(relay_app(callbacks)) as relay:
        server = EnvServer(env_side, secret=SECRET, callback_url=f"{relay}/cb", defer_after_s=0.05)
        with serving(server.app) as url:
            asyncio.run(main(url))
    assert ("e", 1) in callbacks.delivered


def test_the_failure_budget_fails_the_run_with_a_clear_message() -> None:
    env_side = Scripted(refuse_reset=True)

    async def main(url: str) -> None:
        env = client(url, failure_budget=0.0, failure_budget_min=2)
        for episode in ("a", "b"):  # within the budget: ordinary episode failures
            with pytest.raises(WebhookRejected, match="refuses every reset"):
                await env.reset(episode, 0, {})
        with pytest.raises(FailureBudgetExhausted, match="3 of 3 episodes failed") as info:
            await env.reset("c", 0, {})
        assert not isinstance(info.value, EnvironmentFailure)  # the agent must not swallow it
        assert "failure_budget" in str(info.value) and "refuses every reset" in str(info.value)
        with pytest.raises(FailureBudgetExhausted):  # and every later call, without a request
            await env.step("a", 1, Action(content="x"))

    with serving(EnvServer(env_side, secret=SECRET).app) as url:
        asyncio.run(main(url))


def test_the_circuit_breaker_opens_on_a_dead_server_and_recovers() -> None:
    port = free_port()
    env = client(f"http://127.0.0.1:{port}", retries=0, failure_budget_min=10)
    now = [0.0]  # the breaker's clock, so the cool-down passes when the test says
    env.breaker = CircuitBreaker(3, 10.0, clock=lambda: now[0])
    app = Counted(EnvServer(Scripted(), secret=SECRET).app)

    async def down() -> None:
        for _ in range(3):
            with pytest.raises(WebhookUnavailable, match="ClientConnectorError: Cannot connect"):
                await env.reset("e", 0, {})
        assert env.breaker.state == "open"

    async def up() -> None:
        # The server is back, but the breaker holds calls off: the call waits for the
        # cool-down (which this clock never ends) until its deadline, sending nothing.
        env.policy = env.policy.model_copy(update={"step_deadline_s": 0.2})
        with pytest.raises(CircuitOpen, match=r"3 consecutive failures.*until the deadline"):
            await env.reset("e", 0, {})
        assert app.requests["/reset"] == 0
        now[0] += 10.0  # the cool-down
        reset = await env.reset("e", 0, {})  # the half-open probe goes through and succeeds
        assert reset.messages and env.breaker.state == "closed"
        assert app.requests["/reset"] == 1

    asyncio.run(down())
    with serving(app, port=port):
        asyncio.run(up())


def test_max_concurrency_caps_requests_in_flight() -> None:
    env_side = Scripted(step_delays=[0.1] * 6)

    async def main(url: str) -> None:
        env = client(url, concurrency=2)

        async def one(i: int) -> None:
            await env.reset(f"e{i}", i, {})
            await env.step(f"e{i}", 1, Action(content="x"))

        async with asyncio.TaskGroup() as tg:
            for i in range(6):
                tg.create_task(one(i))

    with serving(EnvServer(env_side, secret=SECRET).app) as url:
        asyncio.run(main(url))
    assert env_side.max_in_flight == 2


def test_waiting_for_a_request_slot_is_bounded_by_the_step_deadline() -> None:
    env_side = Scripted(hold=threading.Event())

    async def main(url: str) -> None:
        env = client(url, concurrency=1, retries=0)
        await env.reset("a", 0, {})
        await env.reset("b", 0, {})
        slow = asyncio.ensure_future(env.step("a", 1, Action(content="x")))
        async with asyncio.timeout(10):
            # A counter bumped by the server's thread: there is no event to await, so poll.
            while env_side.in_flight == 0:  # noqa: ASYNC110 ("a"'s step is at the server)
                await asyncio.sleep(0.005)
        env.policy = env.policy.model_copy(update={"step_deadline_s": 0.2})
        with pytest.raises(WebhookUnavailable, match="no request slot"):
            await env.step("b", 1, Action(content="x"))
        assert env_side.hold is not None
        env_side.hold.set()  # the server finishes "a" only now: "b" could not have had it
        assert (await slow).reward == 1.0
        assert env.breaker.consecutive_failures == 0  # a full house is not a server failure

    with serving(EnvServer(env_side, secret=SECRET).app) as url:
        try:
            asyncio.run(main(url))
        finally:
            env_side.hold.set()  # never leave the server's step waiting, even on a failure


def test_breaker_state_machine_with_a_fake_clock() -> None:
    now = [0.0]
    breaker = CircuitBreaker(2, 10.0, clock=lambda: now[0])
    breaker.record_failure()
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 10.0
    assert breaker.allow() and breaker.state == "half_open"
    assert not breaker.allow()  # one probe at a time
    breaker.record_failure()  # the probe failed: open for another cool-down
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 20.0
    assert breaker.allow()
    breaker.abandon()  # the probe was cancelled: the next call may probe instead
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed" and breaker.allow()


def test_budget_counts_each_episode_once_and_backoff_is_bounded() -> None:
    budget = FailureBudget(0.25, 1)
    for _ in range(8):
        budget.start()
    budget.fail("a", "x")
    budget.fail("a", "y")
    budget.fail("b", "z")
    assert (budget.failed, budget.allowed, budget.exhausted) == (2, 2, False)
    budget.fail("c", "w")
    assert budget.exhausted and budget.last_error == "w"
    import random

    rng = random.Random(0)
    delays = [backoff_s(a, 0.1, 1.0, rng) for a in range(8)]
    assert all(0.05 <= d <= 0.1 for d in delays[:1]) and max(delays) <= 1.0
    assert min(delays[4:]) >= 0.5  # capped at 1.0, half of it fixed


def answering(status: int, body: bytes, content_type: bytes) -> Any:
    """An ASGI app that gives every request the same answer."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def rejection(app: Any) -> str:
    """The error a reset against ``app`` raises, as the tenant would read it."""

    async def main(url: str) -> str:
        env = client(url, retries=0)
        try:
            with pytest.raises(WebhookRejected) as info:
                await env.reset("e", 0, {})
        finally:
            await env.aclose()
        return str(info.value)

    with serving(app) as url:
        return asyncio.run(main(url))


def test_an_answer_outside_the_protocol_is_described_never_copied_into_the_error() -> None:
    """A URL that now leads somewhere else (an internal service, cloud metadata) must not
    have its answer read back to the tenant through the run's error."""
    body = b"<html>instance-role credentials: AKIA-SECRET-KEY</html>"
    message = rejection(answering(403, body, b"text/html"))
    assert "SECRET" not in message and "credentials" not in message
    assert "403" in message and "text/html, 55 bytes, not the protocol's error body" in message


def test_the_protocols_error_message_is_kept_short_and_printable() -> None:
    body = json.dumps({"error": {"message": "bad config\x1b[31m " + "x" * 500}}).encode()
    message = rejection(answering(422, body, b"application/json"))
    assert "bad config[31m x" in message and "\x1b" not in message
    assert "x" * 180 in message and "x" * 200 not in message and message.endswith("…")


def self_signed(folder: Any) -> ssl.SSLContext:
    """A server TLS context for 127.0.0.1 with a certificate no CA signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return context


def test_an_https_server_is_verified_against_the_ca_bundle(tmp_path: Any) -> None:
    """TLS is checked: a certificate no CA in certifi's bundle signed is refused (and not
    retried into success), the server never sees the request."""
    from aiohttp import web

    seen: list[str] = []

    async def reset(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"messages": [{"role": "user", "content": "hi"}]})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/reset", reset)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=self_signed(tmp_path)).start()
        try:
            env = client(f"https://127.0.0.1:{port}", retries=0)
            with pytest.raises(WebhookUnavailable, match="certificate verify failed"):
                await env.reset("e", 0, {})
            await env.aclose()
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert seen == []


def test_an_overload_lowers_the_limit_and_is_retried_uncounted_until_the_floor() -> None:
    """A server that answers 503 to everything: with 8 allowed in flight, each 503 halves
    the limit (8 -> 4 -> 2 -> 1) and the request is retried without using a retry or
    moving the breaker; at the floor the server is down, not busy, and the 503 counts."""
    body = json.dumps({"error": {"code": "busy", "message": "too many requests"}}).encode()

    async def main(url: str) -> None:
        env = client(url, retries=0, concurrency=8)
        with pytest.raises(WebhookUnavailable, match="answered 503: too many") as info:
            await env.reset("e", 0, {})
        assert "4 attempts, 3 retried after lowering the concurrency limit" in str(info.value)
        metrics = env.step_metrics()
        assert metrics["env/limit_cuts"] == 3 and metrics["env/concurrency_limit"] == 1
        assert metrics["env/overloads_absorbed"] == 3
        assert metrics["env/faults/status_overload"] == 4
        assert env.breaker.consecutive_failures == 1 and env.budget.failed == 1
        await env.aclose()

    with serving(answering(503, body, b"application/json")) as url:
        asyncio.run(main(url))


def test_calls_held_by_an_open_breaker_go_out_once_its_probe_succeeds() -> None:
    """An open breaker holds calls back instead of failing their episodes: after the
    cool-down one of them probes, and its success lets the others go."""
    app = Counted(EnvServer(Scripted(), secret=SECRET).app)

    async def main(url: str) -> None:
        env = client(url, retries=0)
        env.breaker = CircuitBreaker(1, 0.2)
        env.breaker.record_failure()  # open, as after a failure
        resets = await asyncio.gather(*(env.reset(f"e{i}", i, {}) for i in range(3)))
        assert all(r.messages for r in resets)
        assert (env.breaker.opened, env.breaker.closed, env.budget.failed) == (1, 1, 0)
        await env.aclose()

    with serving(app) as url:
        asyncio.run(main(url))
    assert app.requests["/reset"] == 3  # nothing went out while it was open


def test_a_probe_that_fails_costs_each_held_call_an_attempt() -> None:
    async def main() -> None:
        env = client(f"http://127.0.0.1:{free_port()}", retries=0, concurrency=1)
        env.breaker = CircuitBreaker(1, 0.2)
        env.breaker.record_failure()
        results = await asyncio.gather(
            env.reset("a", 0, {}), env.reset("b", 0, {}), return_exceptions=True
        )
        # One call was the probe and failed on its own; the other waited for it, and with
        # no retries left fails too, without a request of its own.
        kinds = sorted(type(r).__name__ for r in results)
        assert kinds == ["CircuitOpen", "WebhookUnavailable"], results
        assert "a probe failed while the call waited" in str(
            next(r for r in results if isinstance(r, CircuitOpen))
        )
        assert env.faults["connect"] == 1 and env.budget.failed == 2
        await env.aclose()

    asyncio.run(main())


def test_an_answer_over_8_mib_fails_the_episode_without_being_read_or_retried() -> None:
    from rl_core.envs.transport import MAX_ANSWER_BYTES

    app = Counted(answering(200, b" " * (MAX_ANSWER_BYTES + 1), b"application/json"))

    async def main(url: str) -> None:
        env = client(url, retries=3)
        with pytest.raises(WebhookProtocolError, match=r"declares 8388609 bytes, over 8388608"):
            await env.reset("e", 0, {})
        assert env.faults["too_large"] == 1 and env.breaker.consecutive_failures == 0
        await env.aclose()

    with serving(app) as url:
        asyncio.run(main(url))
    assert app.requests["/reset"] == 1


def test_an_answer_sent_without_a_length_is_cut_off_at_8_mib() -> None:
    """Chunked, so only reading tells: the worker stops at 8 MiB, not at the end."""
    from rl_core.envs.transport import MAX_ANSWER_BYTES

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = b" " * (1024 * 1024)
        for _ in range(MAX_ANSWER_BYTES // len(chunk) + 4):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main(url: str) -> None:
        env = client(url, retries=3)
        with pytest.raises(WebhookProtocolError, match=r"runs over 8388608 bytes; not retried"):
            await env.reset("e", 0, {})
        assert env.faults["too_large"] == 1
        await env.aclose()

    with serving(app) as url:
        asyncio.run(main(url))
