"""Where the worker may connect is checked as it connects (issue #17): real loopback HTTP.

The control plane checks a webhook URL when it is registered; these tests show the
worker's transport checking it again at the connection, so a name re-pointed since (or
rebinding between the two checks) cannot reach a metadata, link-local or disallowed
private address. DNS is a stub where the test must say what a name resolves to; the
transport, its checking resolver and the HTTP server are the real ones.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from rl_core.envs import Action
from rl_core.envs.errors import FailureBudgetExhausted, WebhookAddressRefused, WebhookUnavailable
from rl_core.envs.transport import AddressRefused, AiohttpTransport, TransportError
from rl_core.envs.webhook import WebhookEnvironment, WebhookTarget
from rl_core.errors import EnvironmentFailure
from rl_core.protocol.addresses import Allowlist
from rl_core.spec import WebhookCallSpec
from sdk.envserver import EnvServer
from tests.rl_core.envs.test_webhook import self_signed
from tests.sdk.serving import SECRET, Scripted, free_port, serving

NAME = "envs.rlaas.test"  # .test never resolves in real DNS: only the stub answers it
LOOPBACK = Allowlist.parse("loopback", embedded=False)


class StubDns(AbstractResolver):
    """Answers each name with the addresses the test sets (the DNS a tenant controls),
    and counts the questions."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError(f"stub DNS: no such name {host}")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.answers[host]
        ]

    async def close(self) -> None:
        pass


class Seen:
    """ASGI wrapper that keeps each request's path and Host header."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode()
            self.requests.append((scope["path"], host))
        await self.app(scope, receive, send)


@pytest.fixture
def server() -> Iterator[tuple[Seen, int]]:
    seen = Seen(EnvServer(Scripted(), secret=SECRET).app)
    with serving(seen) as url:
        yield seen, int(url.rsplit(":", 1)[1])


def environment(
    url: str, allowlist: Allowlist, dns: StubDns | None = None, **policy: Any
) -> WebhookEnvironment:
    target = WebhookTarget(id="env_t", url=url, secret=SECRET, timeout_s=5.0, allowlist=allowlist)
    transport = None
    if dns is not None:  # the real transport and checking resolver, over the stub's answers
        transport = functools.partial(AiohttpTransport, allowlist=allowlist, resolver=dns)
    spec = WebhookCallSpec(**{"backoff_s": 0.01, "backoff_max_s": 0.05, **policy})
    return WebhookEnvironment(target, policy=spec, transport=transport)


def test_a_name_re_pointed_after_registration_is_refused_at_connect_time(
    server: tuple[Seen, int],
) -> None:
    seen, port = server
    dns = StubDns({NAME: ["127.0.0.1"]})
    url = f"http://{NAME}:{port}"

    async def main() -> None:
        # As registered (loopback allowed, the name resolving there): the episode runs,
        # connected to the checked address with the URL's own name as the Host.
        env = environment(url, LOOPBACK, dns)
        await env.reset("e", 0, {})
        await env.step("e", 1, Action(content="x"))
        await env.close("e")
        await env.aclose()
        assert [host for _, host in seen.requests] == [f"{NAME}:{port}"] * 3

        # The tenant re-points the name at a private address: the next run's connection
        # is refused in words, nothing is sent, and it is not retried.
        dns.answers[NAME] = ["10.0.0.5"]
        dns.asked.clear()
        env = environment(url, LOOPBACK, dns, retries=3)
        with pytest.raises(WebhookAddressRefused) as info:
            await env.reset("f", 0, {})
        message = str(info.value)
        assert (
            f"{NAME} resolves to 10.0.0.5, a private address, which "
            "RLAAS_ENV_URL_ALLOWLIST does not allow" in message
        )
        assert f"POST {url}/reset was not sent" in message and "not retried" in message
        assert isinstance(info.value, EnvironmentFailure)  # the episode fails, the run goes on
        assert dns.asked == [NAME]  # one attempt: a policy refusal is not a network error
        assert env.budget.failed == 1  # counted like a 4xx...
        assert env.breaker.state == "closed" and env.breaker.consecutive_failures == 0
        await env.aclose()

    asyncio.run(main())
    assert len(seen.requests) == 3  # the refused run reached nothing


@pytest.mark.parametrize(
    ("answers", "words"),
    [
        (["127.0.0.1", "169.254.169.254"], "169.254.169.254, a metadata address"),
        (["127.0.0.1", "10.0.0.5"], "10.0.0.5, a private address"),
        (["169.254.1.1"], "169.254.1.1, a link-local address"),
        (["::1", "fe80::1"], "fe80::1, a link-local address"),
    ],
)
def test_every_address_a_name_resolves_to_must_be_allowed(
    server: tuple[Seen, int], answers: list[str], words: str
) -> None:
    """A rebinding resolver that mixes an allowed address with another is refused before
    any connection, whichever address happy eyeballs would have tried first."""
    seen, port = server

    async def main() -> str:
        transport = AiohttpTransport(
            4, allowlist=Allowlist.parse("public,loopback", embedded=False),
            resolver=StubDns({NAME: answers}),
        )  # fmt: skip
        try:
            with pytest.raises(AddressRefused) as info:
                await transport.post(f"http://{NAME}:{port}/reset", b"{}", {}, 5.0)
        finally:
            await transport.aclose()
        assert isinstance(info.value, TransportError)
        return str(info.value)

    message = asyncio.run(main())
    assert message.startswith(f"refused to connect: {NAME} resolves to {words}")
    assert seen.requests == []


def test_a_real_name_for_loopback_is_refused_where_loopback_is_not_allowed(
    server: tuple[Seen, int],
) -> None:
    """No stub: localhost resolves (hosts file) to loopback, which a server's default
    allowlist ("public") refuses; with loopback allowed the same server answers."""
    seen, port = server

    async def main() -> None:
        server_default = Allowlist.parse(None, embedded=False)
        refused = environment(f"http://localhost:{port}", server_default)
        loopback = r"localhost resolves to (127\.0\.0\.1|::1), a loopback address"
        with pytest.raises(WebhookAddressRefused, match=loopback):
            await refused.reset("e", 0, {})
        await refused.aclose()
        assert seen.requests == []
        allowed = environment(f"http://localhost:{port}", Allowlist.parse(None, embedded=True))
        assert (await allowed.reset("e", 0, {})).messages
        await allowed.aclose()

    asyncio.run(main())
    assert [path for path, _ in seen.requests] == ["/reset"]


def test_a_literal_metadata_address_is_refused_even_with_everything_else_allowed() -> None:
    async def main() -> None:
        for allowlist in (
            Allowlist.parse("public,private,loopback", embedded=False),
            WebhookTarget(id="x", url="", secret="").allowlist,  # the own-machine default
        ):
            env = environment("http://169.254.169.254/latest", allowlist)
            with pytest.raises(WebhookAddressRefused) as info:
                await env.reset("e", 0, {})
            await env.aclose()
            assert "169.254.169.254 is a metadata address, which is never allowed" in str(
                info.value
            )

    # Refused before any connection: nothing listens at that address here, and a
    # connection attempt would have been a timeout or a connection error instead.
    asyncio.run(main())


def test_a_literal_loopback_url_is_refused_where_loopback_is_not_allowed(
    server: tuple[Seen, int],
) -> None:
    seen, port = server

    async def main() -> None:
        env = environment(f"http://127.0.0.1:{port}", Allowlist.parse("public", embedded=False))
        with pytest.raises(WebhookAddressRefused, match=r"127\.0\.0\.1 is a loopback address"):
            await env.reset("e", 0, {})
        await env.aclose()

    asyncio.run(main())
    assert seen.requests == []


def test_refusals_count_against_the_failure_budget_and_the_run_error_says_why() -> None:
    dns = StubDns({NAME: ["10.0.0.5"]})

    async def main() -> None:
        env = environment(
            f"http://{NAME}:{free_port()}", LOOPBACK, dns,
            failure_budget=0.0, failure_budget_min=1,
        )  # fmt: skip
        with pytest.raises(WebhookAddressRefused):
            await env.reset("a", 0, {})
        with pytest.raises(FailureBudgetExhausted) as info:
            await env.reset("b", 0, {})
        await env.aclose()
        message = str(info.value)
        assert "2 of 2 episodes failed" in message
        assert "resolves to 10.0.0.5, a private address" in message  # the reason, in words

    asyncio.run(main())


def test_a_metadata_name_is_refused_without_asking_dns() -> None:
    dns = StubDns({"metadata.google.internal": ["8.8.8.8"]})

    async def main() -> None:
        env = environment(
            "http://metadata.google.internal/computeMetadata/v1",
            Allowlist.parse("public", embedded=False),
            dns,
        )
        with pytest.raises(WebhookAddressRefused, match="is the cloud metadata service"):
            await env.reset("e", 0, {})
        await env.aclose()

    asyncio.run(main())
    assert dns.asked == []


def test_tls_is_verified_against_the_urls_name_not_the_checked_address(tmp_path: Any) -> None:
    """aiohttp connects to the address the checking resolver allowed, but TLS speaks the
    URL's name: the server sees it as SNI (the handshake then fails: no CA signed the
    test certificate, and it names 127.0.0.1, not the name)."""
    from aiohttp import web

    sni: list[str | None] = []

    async def main() -> None:
        context = self_signed(tmp_path)
        context.sni_callback = lambda _sock, name, _ctx: sni.append(name)
        runner = web.AppRunner(web.Application())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
        try:
            env = environment(
                f"https://{NAME}:{port}", LOOPBACK, StubDns({NAME: ["127.0.0.1"]}), retries=0
            )
            with pytest.raises(WebhookUnavailable, match="certificate verify failed"):
                await env.reset("e", 0, {})
            await env.aclose()
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert sni == [NAME]
