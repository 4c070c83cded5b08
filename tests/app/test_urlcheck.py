"""The webhook URL allow-list (app.urlcheck): what is refused by default and what opens it."""

from __future__ import annotations

import pytest

from app.settings import SettingsError
from app.urlcheck import Allowlist, UrlRefused, UrlUnresolvable, check_url

pytestmark = pytest.mark.anyio
SERVER = Allowlist.parse(None, embedded=False)
EMBEDDED = Allowlist.parse(None, embedded=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def refused(url: str, allowlist: Allowlist) -> str:
    with pytest.raises(UrlRefused) as info:
        await check_url(url, allowlist)
    return str(info.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),  # IPv4-mapped: the same address
        ("http://100.100.100.200/", "metadata"),
        ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]:8080/", "link-local"),
        ("http://0.0.0.0/", "reserved"),
    ],
)
async def test_metadata_and_link_local_are_refused_even_with_everything_else_allowed(
    url: str, words: str
) -> None:
    everything = Allowlist.parse("public,private,loopback", embedded=False)
    assert words in await refused(url, everything)


async def test_a_cidr_entry_is_the_way_to_allow_a_link_local_address() -> None:
    allowed = Allowlist.parse("169.254.169.254/32", embedded=False)
    assert await check_url("http://169.254.169.254/x", allowed) == "http://169.254.169.254/x"
    assert "link-local" in await refused("http://169.254.1.1/", allowed)


async def test_defaults_server_public_only_embedded_also_loopback() -> None:
    assert await check_url("https://8.8.8.8/env", SERVER) == "https://8.8.8.8/env"
    assert "loopback" in await refused("http://127.0.0.1:8000/env", SERVER)
    assert "loopback" in await refused("http://localhost:8000/env", SERVER)  # resolves to it
    assert await check_url("http://127.0.0.1:8000/env/", EMBEDDED) == "http://127.0.0.1:8000/env"
    assert await check_url("http://localhost:8000/env", EMBEDDED) == "http://localhost:8000/env"
    for allowlist in (SERVER, EMBEDDED):  # private networks are opt-in everywhere
        assert "private" in await refused("http://10.1.2.3/", allowlist)
        assert "private" in await refused("http://[fd00::5]/", allowlist)
        assert "private" in await refused("http://100.64.0.9/", allowlist)


async def test_private_cidr_and_host_entries() -> None:
    corp = Allowlist.parse("10.1.0.0/16", embedded=False)
    assert await check_url("http://10.1.9.9:81/e", corp) == "http://10.1.9.9:81/e"
    assert "private" in await refused("http://10.2.0.1/", corp)
    assert "public" in await refused("http://8.8.8.8/", corp)  # an explicit list is exclusive
    assert await check_url("http://10.9.9.9/", Allowlist.parse("private", embedded=False))
    named = Allowlist.parse("localhost", embedded=False)
    assert await check_url("http://LOCALHOST:9/e", named) == "http://localhost:9/e"
    assert "not in RLAAS_ENV_URL_ALLOWLIST" in await refused("http://example.com/", named)
    assert "loopback" in await refused("http://127.0.0.1/", named)  # the name, not the address
    wildcard = Allowlist.parse("*.invalid", embedded=False)
    assert wildcard.names("envs.example.invalid") and not wildcard.names("invalid")


async def test_a_name_that_does_not_resolve_is_refused_in_words() -> None:
    with pytest.raises(UrlUnresolvable, match="does not resolve"):
        await check_url("http://no-such-host.invalid/", SERVER)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://8.8.8.8/", "http:// or https://"),
        ("8.8.8.8/env", "http:// or https://"),
        ("http:///env", "no host"),
        ("http://u:p@8.8.8.8/", "user:password"),
        ("http://8.8.8.8/?x=1", "query"),
        ("http://8.8.8.8:99999/", "not a valid URL"),
    ],
)
async def test_malformed_urls(url: str, words: str) -> None:
    assert words in await refused(url, SERVER)


def test_a_bad_allowlist_entry_fails_start_up() -> None:
    with pytest.raises(SettingsError, match="not a CIDR"):
        Allowlist.parse("public,10.0.0.0/33", embedded=False)
