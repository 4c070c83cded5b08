"""The address policy both sides apply (rl_core.protocol.addresses): pure, no DNS."""

from __future__ import annotations

import ipaddress

import pytest

from rl_core.protocol.addresses import (
    OWN_MACHINE,
    Allowlist,
    AllowlistError,
    classify,
    ip_literal,
    parse_address,
)

ip = ipaddress.ip_address


def test_the_refusal_names_the_host_the_address_and_the_rule() -> None:
    server = Allowlist.parse(None, embedded=False)
    assert server.refusal("env.example.com", [ip("8.8.8.8")]) is None
    assert server.refusal("Env.Example.com.", [ip("8.8.8.8"), ip("10.0.0.5")]) == (
        "env.example.com resolves to 10.0.0.5, a private address, which "
        "RLAAS_ENV_URL_ALLOWLIST does not allow"
    )
    assert server.refusal("127.0.0.1", [ip("127.0.0.1")]) == (
        "127.0.0.1 is a loopback address, which RLAAS_ENV_URL_ALLOWLIST does not allow"
    )
    assert server.refusal("[::1]", [ip("::1")]) is not None  # a bracketed IPv6 literal


def test_metadata_and_link_local_need_a_cidr_entry_even_for_a_named_host() -> None:
    named = Allowlist.parse("envs.example.com", embedded=False)
    assert named.refusal("envs.example.com", [ip("10.0.0.5")]) is None  # the name allows it
    why = named.refusal("envs.example.com", [ip("169.254.169.254")])
    assert why is not None and "a metadata address, which is never allowed" in why
    opened = Allowlist.parse("envs.example.com,169.254.169.254/32", embedded=False)
    assert opened.refusal("envs.example.com", [ip("169.254.169.254")]) is None


def test_a_metadata_name_and_a_name_no_entry_allows_are_refused_before_dns() -> None:
    everything = Allowlist.parse("public,private,loopback", embedded=False)
    assert "cloud metadata service" in (everything.host_refusal("metadata.google.internal") or "")
    cidr_only = Allowlist.parse("10.1.0.0/16", embedded=False)
    assert cidr_only.host_refusal("env.example.com") == (
        "host env.example.com is not in RLAAS_ENV_URL_ALLOWLIST"
    )
    assert cidr_only.host_refusal("10.1.2.3") is None  # a literal: its address decides
    assert cidr_only.refusal("10.1.2.3", [ip("10.1.2.3")]) is None


def test_the_own_machine_default_allows_private_and_loopback_not_metadata() -> None:
    assert OWN_MACHINE.refusal("127.0.0.1", [ip("127.0.0.1")]) is None
    assert OWN_MACHINE.refusal("box.lan", [ip("192.168.1.9")]) is None
    assert OWN_MACHINE.refusal("169.254.169.254", [ip("169.254.169.254")]) is not None


def test_addresses_are_read_as_the_policy_compares_them() -> None:
    assert classify(ip("::ffff:169.254.169.254")) == "metadata"  # IPv4-mapped
    assert parse_address("fd00:ec2::254%eth0") == ip("fd00:ec2::254")  # the zone dropped
    assert classify(parse_address("fd00:ec2::254%eth0")) == "metadata"
    assert ip_literal("[fe80::1]") == ip("fe80::1")
    assert ip_literal("127.1") is None  # not canonical: checked as what it resolves to
    assert ip_literal("envs.example.com") is None


def test_a_bad_entry_is_an_allowlist_error_naming_it() -> None:
    with pytest.raises(AllowlistError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        Allowlist.parse("public, 10.0.0.0/33", embedded=False)
