"""Name resolution for webhooks, and the rules on where a webhook may go.

The :class:`Resolver` port turns a host into the addresses a webhook would
connect to; :class:`SystemResolver` asks the operating system and
:class:`FakeResolver` is the in-memory twin tests use (no patching). The rules
are pure functions:

- :func:`host_allowed`: ``push.webhook.allowed_domains`` (an exact host, or
  ``*.suffix`` with at least one label before the suffix; case-insensitive).
- :func:`is_blocked_address`: private, loopback, link-local (169.254.169.254
  included), unspecified, reserved and multicast addresses, and the IPv6
  forms that carry such an IPv4 address (IPv4-mapped, IPv4-compatible, 6to4,
  Teredo, NAT64).

Errors::

    ResolveError        the host has no address now (no such name, DNS down)
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import trio

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
"""The well-known NAT64 prefix: its last 32 bits are an IPv4 address."""
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
"""Deprecated IPv4-compatible IPv6 addresses (``::a.b.c.d``); never a public target."""


class ResolveError(Exception):
    """The host could not be resolved to any address (the message names no host)."""


class Resolver(Protocol):
    """Turns a host name into addresses."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The addresses of ``host`` (an IP literal resolves to itself).

        Raises :class:`ResolveError` when there is none. Cancellation abandons
        the lookup.
        """
        ...


def ip_literal(host: str) -> IPAddress | None:
    """``host`` as an address when it is an IP literal (brackets allowed), else ``None``."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class SystemResolver:
    """The operating system's resolver (``getaddrinfo``)."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        literal = ip_literal(host)
        if literal is not None:
            return [literal]
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ResolveError("the host could not be resolved") from exc
        found = _unique(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos)
        if not found:
            raise ResolveError("the host has no address")
        return found

    def __repr__(self) -> str:
        return "SystemResolver()"


class FakeResolver:
    """An in-memory resolver: a table of host -> addresses that a test may change.

    An unknown host raises :class:`ResolveError`; IP literals resolve to themselves.
    """

    def __init__(self, table: Mapping[str, Sequence[str]] | None = None) -> None:
        self._table: dict[str, list[IPAddress]] = {}
        self.lookups = 0
        for host, addresses in (table or {}).items():
            self.set(host, *addresses)

    def set(self, host: str, *addresses: str) -> None:
        """Make ``host`` resolve to ``addresses`` from now on (none: unknown host)."""
        key = host.lower().rstrip(".")
        if addresses:
            self._table[key] = [ipaddress.ip_address(a) for a in addresses]
        else:
            self._table.pop(key, None)

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        await trio.lowlevel.checkpoint()
        self.lookups += 1
        literal = ip_literal(host)
        if literal is not None:
            return [literal]
        found = self._table.get(host.lower().rstrip("."))
        if not found:
            raise ResolveError("the host could not be resolved")
        return list(found)

    def __repr__(self) -> str:
        return f"FakeResolver(hosts={len(self._table)})"


def _unique(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    seen: list[IPAddress] = []
    for address in addresses:
        if address not in seen:
            seen.append(address)
    return seen


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address stands for (mapped, 6to4, Teredo, NAT64)."""
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF))
    return found


def is_blocked_address(address: IPAddress) -> bool:
    """Whether a webhook must not connect to ``address`` (unless private ones are allowed).

    Anything that is not a global unicast address is blocked: private,
    loopback, link-local (cloud metadata at 169.254.169.254 included),
    unspecified, shared (100.64/10), documentation, reserved and multicast;
    for IPv6 also every form that embeds such an IPv4 address.
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address in _IPV4_COMPATIBLE:
            return True
        embedded = _embedded_ipv4(address)
        if embedded:
            return any(is_blocked_address(inner) for inner in embedded)
    return address.is_multicast or not address.is_global


def host_allowed(host: str, patterns: Iterable[str]) -> bool:
    """Whether ``host`` matches an entry of ``push.webhook.allowed_domains``.

    An entry is an exact host, or ``*.suffix``, which matches a host ending in
    ``.suffix`` with at least one label before it (``*.example.org`` matches
    ``a.example.org`` and ``a.b.example.org``, never ``example.org`` or
    ``evilexample.org``). Case-insensitive; a trailing dot is ignored.
    """
    name = host.lower().rstrip(".").strip("[]")
    if not name:
        return False
    for pattern in patterns:
        entry = pattern.lower().rstrip(".")
        if entry.startswith("*."):
            suffix = entry[1:]
            if name.endswith(suffix) and len(name) > len(suffix):
                head = name[: -len(suffix)]
                if head and not head.startswith(".") and not head.endswith("."):
                    return True
        elif name == entry:
            return True
    return False
