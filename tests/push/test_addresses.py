"""Where a webhook may go: the address policy and ``allowed_domains`` matching (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from bothy_notify.push.resolver import FakeResolver, ResolveError, host_allowed, is_blocked_address


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.0.1",
        "0.0.0.0",
        "100.64.0.1",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
        "2002:a00:1::",
    ],
)
def test_private_loopback_link_local_and_unspecified_addresses_are_blocked(address: str) -> None:
    assert is_blocked_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert not is_blocked_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("hooks.example.com", True),
        ("HOOKS.Example.COM", True),
        ("hooks.example.com.", True),
        ("other.example.com", False),
        ("a.example.org", True),
        ("a.b.example.org", True),
        ("example.org", False),
        ("evilexample.org", False),
        ("example.org.evil.net", False),
        (".example.org", False),
        ("", False),
    ],
)
def test_allowed_domains_match_exact_hosts_and_star_suffixes(host: str, allowed: bool) -> None:
    assert host_allowed(host, ["hooks.example.com", "*.Example.org"]) is allowed


def test_no_allowed_domain_allows_nothing() -> None:
    assert not host_allowed("hooks.example.com", [])


async def test_the_fake_resolver_follows_its_table_and_changes() -> None:
    resolver = FakeResolver({"hooks.example.com": ["93.184.216.34"]})
    assert await resolver.resolve("HOOKS.example.com", 443) == [
        ipaddress.ip_address("93.184.216.34")
    ]
    resolver.set("hooks.example.com", "127.0.0.1")
    assert await resolver.resolve("hooks.example.com", 443) == [ipaddress.ip_address("127.0.0.1")]
    assert await resolver.resolve("[::1]", 443) == [ipaddress.ip_address("::1")]
    resolver.set("hooks.example.com")
    with pytest.raises(ResolveError):
        await resolver.resolve("hooks.example.com", 443)


async def test_the_system_resolver_resolves_names_and_literals() -> None:
    from bothy_notify.push.resolver import SystemResolver

    resolver = SystemResolver()
    assert ipaddress.ip_address("127.0.0.1") in await resolver.resolve("localhost", 443)
    assert await resolver.resolve("[::1]", 443) == [ipaddress.ip_address("::1")]
    with pytest.raises(ResolveError):
        await resolver.resolve("no-such-host.invalid", 443)
