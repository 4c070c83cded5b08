"""Which webhook URLs a tenant may register, and the control plane may call.

A webhook URL makes rlaas send requests on a tenant's behalf, so it is a
server-side request forgery risk: the address must not reach the cloud's
metadata service, link-local services or (on a server) the private network,
unless the operator says so in ``RLAAS_ENV_URL_ALLOWLIST``. The entries and the
rule (every address a name resolves to must be allowed) are
``rl_core.protocol.addresses``, which the worker applies too; this module parses
a URL, resolves its host and applies the rule to it.

Unset, the allowlist is ``public`` on a server and ``public,loopback`` on the
embedded default, where an environment usually runs on the same machine;
private networks are opt-in everywhere. Workers read the same variable with
the same defaults.

The check runs at registration and again before each call the control plane
makes (``/check``), so a name re-pointed since registration is refused here.
The worker checks again as it connects, at every connection, and connects only
to the addresses it checked (``rl_core.envs.transport``), so a name re-pointed
after registration, or a resolver that answers differently between this check
and the connection (DNS rebinding), is caught there. The control plane's own
``/check`` call (httpx, ``app.services.env_check``) still resolves the name
again after this check: rebinding inside that window is not caught for it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Self
from urllib.parse import urlsplit

from app.settings import SettingsError
from rl_core.protocol import addresses
from rl_core.protocol.addresses import (
    METADATA_ADDRESSES,
    METADATA_HOSTS,
    IPAddress,
    Network,
    classify,
    ip_literal,
    parse_address,
)

RESOLVE_TIMEOUT_S = 5.0


class UrlRefused(ValueError):
    """The URL is malformed or points where environments may not be; the message says why."""


class UrlUnresolvable(UrlRefused):
    """The URL's host name does not resolve (now): a DNS problem, not a policy one."""


class Allowlist(addresses.Allowlist):
    """`rl_core.protocol.addresses.Allowlist`, whose bad entry fails the API's start-up as
    a `SettingsError`."""

    @classmethod
    def parse(cls, text: str | None, *, embedded: bool) -> Self:
        try:
            return super().parse(text, embedded=embedded)
        except addresses.AllowlistError as exc:
            raise SettingsError(str(exc)) from None


def parse_url(url: str) -> tuple[str, str]:
    """(normalised URL without a trailing slash, lower-case host) or UrlRefused."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises on a bad port
    except ValueError as exc:
        raise UrlRefused(f"url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(f"url must start with http:// or https://, not {parts.scheme or '-'}://")
    if not parts.hostname:
        raise UrlRefused("url has no host; write e.g. https://envs.example.com/my-env")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("url must not carry user:password; the secret signs every request")
    if parts.query or parts.fragment:
        raise UrlRefused("url must not have a query or fragment; /reset, /step, /close are added")
    host = parts.hostname.lower().rstrip(".")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}", host


async def resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        raise UrlUnresolvable(
            f"host {host!r} does not resolve (DNS): {exc or 'timed out'}"
        ) from None
    return sorted({parse_address(str(info[4][0])) for info in infos}, key=str)


async def check_url(url: str, allowlist: addresses.Allowlist) -> str:
    """The normalised URL if every address it reaches is allowed; else UrlRefused."""
    return (await pin_url(url, allowlist))[0]


async def pin_url(url: str, allowlist: addresses.Allowlist) -> tuple[str, IPAddress]:
    """`check_url`, and the checked address to connect to. Connect there, not to the name:
    a name asked again may answer otherwise (DNS rebinding: allowed when checked, the
    metadata address when connected)."""
    normalised, host = parse_url(url)
    # The name alone first: a metadata name is refused without asking DNS about it.
    why = allowlist.host_refusal(host)
    found: list[IPAddress] = []
    if why is None:
        literal = ip_literal(host)
        port = urlsplit(normalised).port or (443 if normalised.startswith("https") else 80)
        found = [literal] if literal is not None else await resolve(host, port)
        why = allowlist.refusal(host, found)
    if why is not None or not found:
        raise UrlRefused(f"url is refused: {why or 'no address'}")
    return normalised, found[0]


__all__ = [
    "METADATA_ADDRESSES",
    "METADATA_HOSTS",
    "Allowlist",
    "IPAddress",
    "Network",
    "UrlRefused",
    "UrlUnresolvable",
    "check_url",
    "classify",
    "parse_url",
    "pin_url",
    "resolve",
]
