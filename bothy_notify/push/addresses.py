"""Which addresses a webhook or a Web Push send may connect to, from the registries.

One table per address family, built from the IANA IPv4 and IPv6
Special-Purpose Address Registries (each row its prefix, its name and its
RFC), with the few rows the registries leave to other documents: IPv4
multicast (RFC 5771), IPv6 multicast (RFC 4291), deprecated IPv4-compatible
(``::/96``) and site-local (``fec0::/10``, RFC 3879) addresses, SIIT's
IPv4-translated ``::ffff:0:0:0/96`` (RFC 2765), and the IPv6 space outside
global unicast ``2000::/3``. The verdict of an address is its most specific
row's, so it does not depend on the Python version (``ipaddress.is_global``
changed between releases and accepts ``fec0::/10`` on 3.11):

- ``GLOBAL``: the registry says globally reachable (or the address is in no
  special-purpose block);
- ``REFUSED``: not globally reachable, reserved, deprecated, or multicast;
- ``EMBEDDED``: an IPv6 form that carries an IPv4 address (IPv4-mapped, SIIT's
  IPv4-translated, the NAT64 well-known prefix ``64:ff9b::/96``, 6to4,
  Teredo): the IPv4 address (both of Teredo's: server and client) is taken
  out and judged by the IPv4 table.

The local-use NAT64 prefix ``64:ff9b:1::/48`` (RFC 8215) is refused whole:
the registry says it is not globally reachable, and where its IPv4 address
sits depends on a prefix length only the operator's translator knows.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Verdict(enum.Enum):
    GLOBAL = "global"
    REFUSED = "refused"
    EMBEDDED = "embedded"


class Embedding(enum.Enum):
    """Where an IPv6 form keeps its IPv4 address."""

    LOW_32 = "low_32"  # mapped, translated, NAT64 /96: the last 32 bits
    SIX_TO_FOUR = "6to4"  # 2002:AABB:CCDD::/48: bits 16..47
    TEREDO = "teredo"  # server in bits 32..63, client in the last 32 bits inverted


@dataclass(frozen=True, slots=True)
class Row:
    """One block of an address registry."""

    prefix: str
    name: str
    rfc: str
    verdict: Verdict
    embedding: Embedding | None = None

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(self.prefix)


_G, _R = Verdict.GLOBAL, Verdict.REFUSED

IPV4_ROWS: tuple[Row, ...] = (
    Row("0.0.0.0/0", "IPv4 unicast outside every special-purpose block", "RFC 791", _G),
    Row("0.0.0.0/8", '"This network"', "RFC 791", _R),
    Row("0.0.0.0/32", '"This host on this network"', "RFC 1122", _R),
    Row("10.0.0.0/8", "Private-Use", "RFC 1918", _R),
    Row("100.64.0.0/10", "Shared Address Space", "RFC 6598", _R),
    Row("127.0.0.0/8", "Loopback", "RFC 1122", _R),
    Row("169.254.0.0/16", "Link Local", "RFC 3927", _R),
    Row("172.16.0.0/12", "Private-Use", "RFC 1918", _R),
    Row("192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890", _R),
    Row("192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", _R),
    Row("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", _R),
    Row("192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", _G),
    Row("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", _G),
    Row("192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880", _R),
    Row("192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880", _R),
    Row("192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", _R),
    Row("192.31.196.0/24", "AS112-v4", "RFC 7535", _G),
    Row("192.52.193.0/24", "AMT", "RFC 7450", _G),
    Row("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", _R),
    Row("192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", _R),
    Row("192.168.0.0/16", "Private-Use", "RFC 1918", _R),
    Row("192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", _G),
    Row("198.18.0.0/15", "Benchmarking", "RFC 2544", _R),
    Row("198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", _R),
    Row("203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", _R),
    Row("224.0.0.0/4", "Multicast", "RFC 5771", _R),
    Row("240.0.0.0/4", "Reserved", "RFC 1112", _R),
    Row("255.255.255.255/32", "Limited Broadcast", "RFC 8190", _R),
)
"""The IPv4 table: IANA's IPv4 Special-Purpose Address Registry, plus multicast."""

IPV6_ROWS: tuple[Row, ...] = (
    Row("::/0", "Reserved by the IETF (outside global unicast 2000::/3)", "RFC 4291", _R),
    Row("2000::/3", "Global Unicast", "RFC 4291", _G),
    Row("::/128", "Unspecified Address", "RFC 4291", _R),
    Row("::1/128", "Loopback Address", "RFC 4291", _R),
    Row("::/96", "IPv4-Compatible (deprecated)", "RFC 4291", _R),
    Row("::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", Verdict.EMBEDDED, Embedding.LOW_32),
    Row(
        "::ffff:0:0:0/96",
        "IPv4-translated Address (SIIT)",
        "RFC 2765",
        Verdict.EMBEDDED,
        Embedding.LOW_32,
    ),
    Row("64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", Verdict.EMBEDDED, Embedding.LOW_32),
    Row("64:ff9b:1::/48", "IPv4-IPv6 Translat. (local use)", "RFC 8215", _R),
    Row("100::/64", "Discard-Only Address Block", "RFC 6666", _R),
    Row("100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", _R),
    Row("2001::/23", "IETF Protocol Assignments", "RFC 2928", _R),
    Row("2001::/32", "TEREDO", "RFC 4380", Verdict.EMBEDDED, Embedding.TEREDO),
    Row("2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", _G),
    Row("2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", _G),
    Row("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", _G),
    Row("2001:2::/48", "Benchmarking", "RFC 5180", _R),
    Row("2001:3::/32", "AMT", "RFC 7450", _G),
    Row("2001:4:112::/48", "AS112-v6", "RFC 7535", _G),
    Row("2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", _R),
    Row("2001:20::/28", "ORCHIDv2", "RFC 7343", _G),
    Row("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", _G),
    Row("2001:db8::/32", "Documentation", "RFC 3849", _R),
    Row("2002::/16", "6to4", "RFC 3056", Verdict.EMBEDDED, Embedding.SIX_TO_FOUR),
    Row("2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", _G),
    Row("3fff::/20", "Documentation", "RFC 9637", _R),
    Row("5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", _R),
    Row("fc00::/7", "Unique-Local", "RFC 4193", _R),
    Row("fe80::/10", "Link-Local Unicast", "RFC 4291", _R),
    Row("fec0::/10", "Site-Local (deprecated)", "RFC 3879", _R),
    Row("ff00::/8", "Multicast", "RFC 4291", _R),
)
"""The IPv6 table: IANA's IPv6 Special-Purpose Address Registry, plus the rows the
module docstring names."""


def _compiled(rows: tuple[Row, ...], bits: int) -> tuple[tuple[int, int, Row], ...]:
    """(network as an integer, mask, row), the most specific first."""
    out = []
    for row in rows:
        network = row.network
        mask = ((1 << network.prefixlen) - 1) << (bits - network.prefixlen)
        out.append((int(network.network_address), mask, row))
    return tuple(sorted(out, key=lambda entry: -entry[2].network.prefixlen))


_V4 = _compiled(IPV4_ROWS, 32)
_V6 = _compiled(IPV6_ROWS, 128)


def row_of(address: IPAddress) -> Row:
    """The most specific row of ``address``'s table that holds it."""
    value = int(address)
    for network, mask, row in _V4 if address.version == 4 else _V6:
        if value & mask == network:
            return row
    raise AssertionError("every table has a row for its whole space")  # pragma: no cover


def embedded_ipv4(
    address: ipaddress.IPv6Address, embedding: Embedding
) -> list[ipaddress.IPv4Address]:
    """The IPv4 address(es) an IPv6 form carries."""
    value = int(address)
    if embedding is Embedding.LOW_32:
        return [ipaddress.IPv4Address(value & 0xFFFF_FFFF)]
    if embedding is Embedding.SIX_TO_FOUR:
        return [ipaddress.IPv4Address((value >> 80) & 0xFFFF_FFFF)]
    server = ipaddress.IPv4Address((value >> 64) & 0xFFFF_FFFF)
    client = ipaddress.IPv4Address(~value & 0xFFFF_FFFF)
    return [server, client]


def is_blocked_address(address: IPAddress) -> bool:
    """Whether a send must not connect to ``address`` (unless private ones are allowed):
    its row refuses it, or it carries an IPv4 address the IPv4 table refuses."""
    row = row_of(address)
    if row.verdict is Verdict.GLOBAL:
        return False
    if row.verdict is Verdict.REFUSED or row.embedding is None:
        return True
    assert isinstance(address, ipaddress.IPv6Address)
    return any(
        row_of(inner).verdict is not Verdict.GLOBAL
        for inner in embedded_ipv4(address, row.embedding)
    )
