"""Where a webhook environment may be: the address policy of ``RLAAS_ENV_URL_ALLOWLIST``.

A webhook URL makes rlaas send requests on a tenant's behalf (server-side
request forgery), so both sides apply one rule to it: the control plane when
the URL is registered and at ``/check`` (``app/urlcheck.py``), the worker at
every connection it opens (``rl_core/envs/transport.py``). The allowlist is a
comma-separated list of entries:

==============  ==========================================================
``public``      any public unicast address
``loopback``    127.0.0.0/8 and ::1
``private``     10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7
``<CIDR>``      e.g. ``10.1.0.0/16``; the only way to allow link-local or
                metadata addresses (``169.254.169.254/32``)
``<host>``      an exact host name, e.g. ``envs.example.com``
``*.<domain>``  any name under the domain
==============  ==========================================================

Every address a name resolves to must be allowed (a name that resolves to one
public and one private address is refused). A host entry allows its name, but
its addresses must still not be link-local or metadata unless a CIDR entry
covers them.

This module is the rule alone: pure functions of a host name and the
addresses it resolved to, no DNS and no sockets (each side resolves in its own
way). It lives in ``rl_core.protocol`` because it is part of the contract
between the control plane and the worker, and this is the lowest room that
both may import: ``app`` may not import ``rl_core.envs``, and ``rl_core`` may
not import ``app``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

CLASSES = ("public", "loopback", "private")
METADATA_HOSTS = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
     "instance-data.ec2.internal", "metadata.azure.com"}
)  # fmt: skip
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private in practice
# Kinds no class entry opens: only a CIDR entry that covers the address does.
_NEVER = ("metadata", "link-local", "reserved")

# The defaults when RLAAS_ENV_URL_ALLOWLIST is unset: a server calls only public
# addresses; the embedded default (everything on one machine) also loopback. Private
# networks are opt-in on both. A run on one's own machine with no server at all
# (`rlaas train`, rl_core as a library) calls the user's own servers: `OWN_MACHINE`.
SERVER_DEFAULT = "public"
EMBEDDED_DEFAULT = "public,loopback"
OWN_MACHINE_DEFAULT = "public,loopback,private"


class AllowlistError(ValueError):
    """An entry of the allowlist is malformed; the message names it."""


@dataclass(frozen=True)
class Allowlist:
    classes: frozenset[str]
    networks: tuple[Network, ...]
    hosts: frozenset[str]
    domains: tuple[str, ...]  # ".example.com" for "*.example.com"

    @classmethod
    def parse(cls, text: str | None, *, embedded: bool) -> Self:
        """The allowlist ``text`` spells; unset or blank, the default of a server (or,
        with ``embedded``, of the embedded default)."""
        if text is None or not text.strip():
            text = EMBEDDED_DEFAULT if embedded else SERVER_DEFAULT
        classes: set[str] = set()
        networks: list[Network] = []
        hosts: set[str] = set()
        domains: list[str] = []
        for raw in text.split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry in CLASSES:
                classes.add(entry)
            elif entry.startswith("*."):
                domains.append(entry[1:])
            elif any(c in entry for c in "/:") or entry.replace(".", "").isdigit():
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError as exc:
                    raise AllowlistError(
                        f"RLAAS_ENV_URL_ALLOWLIST entry {raw.strip()!r} is not a CIDR: {exc}"
                    ) from None
            else:
                hosts.add(entry.rstrip("."))
        return cls(frozenset(classes), tuple(networks), frozenset(hosts), tuple(domains))

    def names(self, host: str) -> bool:
        """Does a host or ``*.domain`` entry name ``host`` (lower case, no trailing dot)?"""
        return host in self.hosts or any(host.endswith(d) for d in self.domains)

    def host_refusal(self, host: str) -> str | None:
        """What the name alone decides, before any DNS: None if ``host`` may be resolved
        (its addresses still to be checked with `refusal`); else why not, in words."""
        host = normalise_host(host)
        if self.names(host):
            return None
        if host in METADATA_HOSTS:
            return (
                f"{host} is the cloud metadata service, which is never allowed unless "
                "RLAAS_ENV_URL_ALLOWLIST names it"
            )
        if ip_literal(host) is None and not self.classes:
            return f"host {host} is not in RLAAS_ENV_URL_ALLOWLIST"
        return None

    def address_refusal(self, ip: IPAddress, *, named: bool) -> str | None:
        """None if ``ip`` may be called; else what it is and why not, as a phrase
        ("a private address, which RLAAS_ENV_URL_ALLOWLIST does not allow")."""
        if any(ip in net for net in self.networks):
            return None
        kind = classify(ip)
        if kind in _NEVER:
            return (
                f"a {kind} address, which is never allowed unless a CIDR entry of "
                "RLAAS_ENV_URL_ALLOWLIST covers it"
            )
        if named or kind in self.classes:
            return None
        return f"a {kind} address, which RLAAS_ENV_URL_ALLOWLIST does not allow"

    def refusal(self, host: str, addresses: Iterable[IPAddress]) -> str | None:
        """None if ``host`` may be called at every one of ``addresses`` (what it resolved
        to; for an IP literal, the address itself); else why not, as a sentence that names
        the host and the address: "env.example.com resolves to 10.0.0.5, a private
        address, which RLAAS_ENV_URL_ALLOWLIST does not allow"."""
        host = normalise_host(host)
        why = self.host_refusal(host)
        if why is not None:
            return why
        named = self.names(host)
        literal = ip_literal(host)
        for ip in addresses:
            why = self.address_refusal(ip, named=named)
            if why is not None and literal is not None:
                return f"{ip} is {why}"
            if why is not None:
                return f"{host} resolves to {ip}, {why}"
        return None


def classify(ip: IPAddress) -> str:
    """``metadata``, ``link-local``, ``loopback``, ``reserved``, ``private`` or ``public``."""
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


def normalise_host(host: str) -> str:
    """A URL's host as the policy compares it: lower case, no brackets, no trailing dot."""
    return host.strip("[]").lower().rstrip(".")


def ip_literal(host: str) -> IPAddress | None:
    """The address, when ``host`` is an IP literal in canonical form; else None (a name,
    which ``127.1`` and ``2130706433`` are too: they are checked as what they resolve to)."""
    try:
        return parse_address(normalise_host(host))
    except ValueError:
        return None


def parse_address(text: str) -> IPAddress:
    """A resolver's answer (``"10.0.0.5"``, ``"fe80::1%eth0"``) as an address, without
    its IPv6 zone (``fe80::1%eth0`` would not equal ``fe80::1``)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


OWN_MACHINE = Allowlist.parse(OWN_MACHINE_DEFAULT, embedded=True)

__all__ = [
    "CLASSES",
    "EMBEDDED_DEFAULT",
    "METADATA_ADDRESSES",
    "METADATA_HOSTS",
    "OWN_MACHINE",
    "OWN_MACHINE_DEFAULT",
    "SERVER_DEFAULT",
    "Allowlist",
    "AllowlistError",
    "IPAddress",
    "Network",
    "classify",
    "ip_literal",
    "normalise_host",
    "parse_address",
]
