"""Which webhook URLs a tenant may register, and the control plane may call.

A webhook URL makes rlaas send requests on a tenant's behalf, so it is a
server-side request forgery risk: the address must not reach the cloud's
metadata service, link-local services or (on a server) the private network,
unless the operator says so in ``RLAAS_ENV_URL_ALLOWLIST``, a comma-separated
list of entries:

==============  ==========================================================
``public``      any public unicast address
``loopback``    127.0.0.0/8 and ::1
``private``     10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7
``<CIDR>``      e.g. ``10.1.0.0/16``; the only way to allow link-local or
                metadata addresses (``169.254.169.254/32``)
``<host>``      an exact host name, e.g. ``envs.example.com``
``*.<domain>``  any name under the domain
==============  ==========================================================

Unset, it is ``public`` on a server and ``public,loopback`` on the embedded
default, where an environment usually runs on the same machine; private
networks are opt-in everywhere.

Every address a name resolves to must be allowed (a name that resolves to one
public and one private address is refused). A host entry allows its name,
but its addresses must still not be link-local or metadata unless a CIDR entry
covers them. The check runs at registration and again before each call the
control plane makes (``/check``), so a name re-pointed since registration is
caught; a resolver that answers differently between the check and the
connection (DNS rebinding inside milliseconds) is not.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.settings import SettingsError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_CLASSES = ("public", "loopback", "private")
METADATA_HOSTS = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
     "instance-data.ec2.internal", "metadata.azure.com"}
)  # fmt: skip
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private in practice
RESOLVE_TIMEOUT_S = 5.0


class UrlRefused(ValueError):
    """The URL is malformed or points where environments may not be; the message says why."""


class UrlUnresolvable(UrlRefused):
    """The URL's host name does not resolve (now): a DNS problem, not a policy one."""


@dataclass(frozen=True)
class Allowlist:
    classes: frozenset[str]
    networks: tuple[Network, ...]
    hosts: frozenset[str]
    domains: tuple[str, ...]  # ".example.com" for "*.example.com"

    @classmethod
    def parse(cls, text: str | None, *, embedded: bool) -> Allowlist:
        if text is None or not text.strip():
            text = "public,loopback" if embedded else "public"
        classes: set[str] = set()
        networks: list[Network] = []
        hosts: set[str] = set()
        domains: list[str] = []
        for raw in text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry in _CLASSES:
                classes.add(entry)
            elif entry.startswith("*."):
                domains.append(entry[1:])
            elif any(c in entry for c in "/:") or entry.replace(".", "").isdigit():
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError as exc:
                    raise SettingsError(
                        f"RLAAS_ENV_URL_ALLOWLIST entry {raw.strip()!r} is not a CIDR: {exc}"
                    ) from None
            else:
                hosts.add(entry.rstrip("."))
        return cls(frozenset(classes), tuple(networks), frozenset(hosts), tuple(domains))

    def names(self, host: str) -> bool:
        return host in self.hosts or any(host.endswith(d) for d in self.domains)

    def address_refusal(self, ip: IPAddress, *, named: bool) -> str | None:
        """None if ``ip`` may be called; else why not, in words."""
        if any(ip in net for net in self.networks):
            return None
        kind = classify(ip)
        if kind in ("metadata", "link-local", "reserved"):
            return f"{ip} is a {kind} address"
        if named or kind in self.classes:
            return None
        return f"{ip} is a {kind} address and RLAAS_ENV_URL_ALLOWLIST does not allow {kind}"


def classify(ip: IPAddress) -> str:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_link_local:
        return "link-local"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "reserved"
    if ip.is_private or ip in _SHARED:
        return "private"
    return "public" if ip.is_global else "reserved"


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
    return sorted(
        {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}, key=str
    )


async def check_url(url: str, allowlist: Allowlist) -> str:
    """The normalised URL if every address it reaches is allowed; else UrlRefused."""
    normalised, host = parse_url(url)
    named = allowlist.names(host)
    if host in METADATA_HOSTS and not named:
        raise UrlRefused(
            f"url points at the cloud metadata service ({host}); that is never allowed"
        )
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is None and not named and not allowlist.classes:
        raise UrlRefused(f"host {host} is not in RLAAS_ENV_URL_ALLOWLIST")
    port = urlsplit(normalised).port or (443 if normalised.startswith("https") else 80)
    addresses = [literal] if literal is not None else await resolve(host, port)
    for ip in addresses:
        why = allowlist.address_refusal(ip, named=named)
        if why is not None:
            where = "" if literal is not None else f"host {host} resolves to "
            raise UrlRefused(f"url is refused: {where}{why}; see RLAAS_ENV_URL_ALLOWLIST")
    return normalised
