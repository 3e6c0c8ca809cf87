"""Resolving and pinning for the providers whose hosts come from registrations and that
send through an :class:`~.http2.Http2Client` (Web Push, a Matrix relay).

Each attempt resolves its host again (a DNS answer may change between two
attempts), every address is judged by the registries' table unless private
addresses are allowed, and the transfer is pinned to the checked address with
libcurl's ``CONNECT_TO``: TLS and ``Host`` still name the host, so a DNS answer
that changed between the check and the connection cannot redirect it, and a
connection is reused only for the same host and address.

Attempts to one host at the same moment (a claimed batch to one push service or
gateway) share one lookup (:class:`SharedLookups`), whose answer arrives after
each of them began.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import trio

from bothy_notify.push.resolver import IPAddress, ResolveError, Resolver

_ENDPOINT = re.compile(
    r"https://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?((?:/[\x21-\x7e]*)?)"
)
"""An endpoint's host, port and path, read at registration and at every send without
building a URL object (the rest of a provider's rules are its own, e.g. Web Push's
``_endpoint_url``)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An https endpoint of a registration (a push service's, a Matrix gateway's) in its
    one spelling: the host lower-cased without a trailing dot (an IPv6 literal without
    brackets), the port 1-65535 (443 when the URL names none), and the path as given.

    :attr:`origin` is RFC 6454's serialisation of its origin, the default port left
    out (Web Push's VAPID ``aud``, RFC 8292) and :attr:`url` what a registration
    stores and a send posts to.
    """

    host: str
    port: int
    path: str

    @property
    def origin(self) -> str:
        authority = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{authority}" if self.port == 443 else f"https://{authority}:{self.port}"

    @property
    def url(self) -> str:
        return self.origin + self.path


@functools.lru_cache(maxsize=4096)
def parse_endpoint(text: str) -> Endpoint | None:
    """``text`` as an :class:`Endpoint`, or ``None`` when it is not an https URL of the
    endpoint's form or its port is outside 1-65535 (written without leading zeros)."""
    match = _ENDPOINT.fullmatch(text)
    if match is None:
        return None
    name, port_text, path = match.groups()
    host = name[1:-1].lower() if name.startswith("[") else name.lower().rstrip(".")
    if not host:
        return None
    if port_text is None:
        return Endpoint(host, 443, path)
    if port_text.startswith("0") or not 1 <= int(port_text) <= 65_535:
        return None
    return Endpoint(host, int(port_text), path)


class SharedLookups:
    """Resolves hosts for attempts, one lookup per host at a time.

    Args:
        resolver: name resolution.
    """

    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver
        self._lookups: dict[tuple[str, int], _Lookup] = {}

    def __repr__(self) -> str:
        return f"SharedLookups(in_flight={len(self._lookups)})"

    async def resolve(self, host: str, port: int, deadline: float) -> list[IPAddress] | None:
        """The host's addresses, looked up for this attempt (``None``: not by
        ``deadline``, a Trio time).

        Only the attempt that looks up keeps a deadline scope (the others wait
        for its answer, and look up themselves should it be cancelled first).
        Raises :class:`ResolveError`.
        """
        key = (host, port)
        while trio.current_time() < deadline:
            lookup = self._lookups.get(key)
            if lookup is None:
                lookup = self._lookups[key] = _Lookup()
                try:
                    with trio.move_on_at(deadline):
                        lookup.addresses = await self._resolver.resolve(host, port)
                except ResolveError:
                    lookup.failed = True
                finally:
                    del self._lookups[key]
                    lookup.done.set()
            else:
                await lookup.done.wait()
            if lookup.failed:
                raise ResolveError("the host could not be resolved")
            if lookup.addresses is not None:
                return lookup.addresses
            # The attempt that looked up ran out of time first: look up again.
        return None


class _Lookup:
    """One name lookup that several attempts wait for."""

    __slots__ = ("addresses", "done", "failed")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.addresses: list[IPAddress] | None = None
        self.failed = False


@functools.lru_cache(maxsize=1024)
def connect_to(host: str, port: int, address: IPAddress) -> str:
    """libcurl's ``CONNECT_TO`` from ``host:port`` to the checked ``address``."""
    literal = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{port}:{literal}:{port}"
