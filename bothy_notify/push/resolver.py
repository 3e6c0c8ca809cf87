"""Name resolution for webhooks, and the rules on where a webhook may go.

The :class:`Resolver` port turns a host into the addresses a webhook would
connect to; :class:`SystemResolver` asks the operating system and
:class:`FakeResolver` is the in-memory twin tests use (no patching). The rules
are pure functions:

- :func:`host_allowed`: ``push.webhook.allowed_domains`` (an exact host, or
  ``*.suffix`` with at least one label before the suffix; case-insensitive);
  :func:`is_host_pattern` the form of such an entry (``prepare`` checks it).
- :func:`~.addresses.is_blocked_address` (from :mod:`.addresses`, the table of
  the IANA special-purpose registries): every address that is not globally
  reachable, and the IPv6 forms that carry such an IPv4 address.

Errors::

    ResolveError        the host has no address now (no such name, DNS down)
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import trio

from bothy_notify.push.addresses import IPAddress, is_blocked_address

__all__ = [
    "FakeResolver",
    "IPAddress",
    "ResolveError",
    "Resolver",
    "SystemResolver",
    "host_allowed",
    "ip_literal",
    "is_blocked_address",
    "is_host_pattern",
]


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


_HOST_PATTERN = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$"
    r"|^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
)


def is_host_pattern(pattern: str) -> bool:
    """Whether ``pattern`` is an entry :func:`host_allowed` takes: a host name, or
    ``*.suffix`` with at least one label in the suffix (case-insensitive)."""
    return _HOST_PATTERN.fullmatch(pattern.lower()) is not None


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
