"""The Autobahn testsuite's cases of sections 1 to 7, as a table, over real sockets.

``make autobahn`` runs the testsuite itself (Python 2.7, outside ``make
test``); this table keeps its cases in the suite: each row sends the bytes a
case sends to :mod:`tests.gateway.compliance.echo` (the gateway's own
transport and frame code) on 127.0.0.1 and checks what comes back, in order:
the echoed messages and pongs, then the close. ``close=None``: the server
waits for ours (we close with 1000 and it answers 1000); a code: the server
closes with it, and after 1002 or 1007 (RFC 6455 section 7.1.7, nothing more
is read) it ends its side of the TCP connection without waiting for ours.

Rows are named after Autobahn's cases (``1.1.1`` ...); the UTF-8 rows
(section 6) carry Markus Kuhn's decoder test sequences, each marked valid or
not by its class (not by a decoder). Where Autobahn sends a message in chops
with waits between, the chops here are separate writes without waits (the
frame tests in ``tests/gateway/test_frames.py`` cut the bytes everywhere);
where a case waits to see the connection fail before its last part
(fail-fast, 6.4.x), the row stops sending there. Rows marked ``G.*`` are the
gateway's own: the size limit (1009) and messages before a broken frame.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trio
from wsproto.frame_protocol import FrameProtocol, Opcode

from tests.gateway.compliance.echo import serve_echo

LIMIT = 300_000
"""``sync.max_frame_bytes`` of the server under test: above 7.1.6's 256 KiB message."""

Event = tuple[str, str | bytes | int]
"""What the server sends: ("text", str), ("binary", bytes), ("pong", bytes)."""


def wire(
    opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0, masked: bool = True
) -> bytes:
    """One client frame with any header (the shortest length form)."""
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    mask_bit = 0x80 if masked else 0
    n = len(payload)
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 65536:
        head += bytes([mask_bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([mask_bit | 127]) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


TEXT, BINARY, CLOSE, PING, PONG, CONT = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0


def text(data: str | bytes, *, fin: bool = True, rsv: int = 0, masked: bool = True) -> bytes:
    payload = data.encode() if isinstance(data, str) else data
    return wire(TEXT, payload, fin=fin, rsv=rsv, masked=masked)


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return code.to_bytes(2, "big") + reason


def chops(data: bytes, size: int) -> tuple[bytes, ...]:
    return tuple(data[i : i + size] for i in range(0, len(data), size))


@dataclass(frozen=True)
class Case:
    """One row: the bytes sent (each item one write), what comes back before the
    close, and the code of the server's close frame: ``None``, it waits for ours
    (1000, answered with 1000); a code, it closes, or answers the close sent with it.
    Then the server ends the connection, except when ``waits``: it closed first (not
    failing the connection) and waits for our close frame."""

    name: str
    send: tuple[bytes, ...]
    answer: tuple[Event, ...] = ()
    close: int | None = None
    waits: bool = False


def framing() -> list[Case]:
    """Section 1: text and binary messages of every length form, whole and chopped."""
    rows = []
    for i, n in enumerate((0, 125, 126, 127, 128, 65535, 65536), 1):
        rows.append(Case(f"1.1.{i}", (text("*" * n),), (("text", "*" * n),)))
        rows.append(Case(f"1.2.{i}", (wire(BINARY, b"\xfe" * n),), (("binary", b"\xfe" * n),)))
    rows.append(Case("1.1.8", chops(text("*" * 65536), 997), (("text", "*" * 65536),)))
    rows.append(
        Case("1.2.8", chops(wire(BINARY, b"\xfe" * 65536), 997), (("binary", b"\xfe" * 65536),))
    )
    return rows


def pings() -> list[Case]:
    """Section 2: pings answered with their payload, pongs ignored, long pings refused."""
    hello = b"Hello, world!"
    binary = bytes([0x00, 0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0x00, 0xFF])
    ten = tuple(wire(PING, b"payload-%d" % i) for i in range(10))
    return [
        Case("2.1", (wire(PING),), (("pong", b""),)),
        Case("2.2", (wire(PING, hello),), (("pong", hello),)),
        Case("2.3", (wire(PING, binary),), (("pong", binary),)),
        Case("2.4", (wire(PING, b"\xfe" * 125),), (("pong", b"\xfe" * 125),)),
        Case("2.5", (wire(PING, b"\xfe" * 126),), close=1002),
        Case("2.6", chops(wire(PING, b"\xfe" * 125), 1), (("pong", b"\xfe" * 125),)),
        Case("2.7", (wire(PONG),)),
        Case("2.8", (wire(PONG, b"unsolicited pong payload"),)),
        Case("2.9", (wire(PONG, b"unsolicited pong payload"), wire(PING, b"ping payload")),
             (("pong", b"ping payload"),)),
        Case("2.10", ten, tuple(("pong", b"payload-%d" % i) for i in range(10))),
        Case("2.11", tuple(c for f in ten for c in chops(f, 1)),
             tuple(("pong", b"payload-%d" % i) for i in range(10))),
    ]  # fmt: skip


def reserved_bits() -> list[Case]:
    """Section 3: no extension is negotiated, so any RSV bit fails the connection
    (and a message before it is still echoed)."""
    small = "Hello, world!"
    bad_then_ping = (text(small), text(small, rsv=2), wire(PING))
    return [
        Case("3.1", (text(small, rsv=1),), close=1002),
        Case("3.2", bad_then_ping, (("text", small),), close=1002),
        Case("3.3", (b"".join(bad_then_ping),), (("text", small),), close=1002),
        Case("3.4", chops(b"".join(bad_then_ping), 1), (("text", small),), close=1002),
        Case("3.5", (wire(BINARY, b"\xff" * 8, rsv=5),), close=1002),
        Case("3.6", (wire(PING, b"\xff" * 8, rsv=6),), close=1002),
        Case("3.7", (wire(CLOSE, close_payload(1000), rsv=7),), close=1002),
    ]


def opcodes() -> list[Case]:
    """Section 4: the reserved opcodes 3-7 and 11-15 fail the connection, also after
    a message (which is still echoed)."""
    rows = []
    for section, codes in (("4.1", (3, 4, 5, 6, 7)), ("4.2", (11, 12, 13, 14, 15))):
        for i, op in enumerate(codes, 1):
            payload = b"" if i % 2 else b"reserved opcode payload"
            if i in (1, 2):
                rows.append(Case(f"{section}.{i}", (wire(op, payload),), close=1002))
            else:
                rows.append(
                    Case(
                        f"{section}.{i}",
                        (text("Hello, world!"), wire(op, payload), wire(PING)),
                        (("text", "Hello, world!"),),
                        close=1002,
                    )
                )
    return rows


def fragmentation() -> list[Case]:
    """Section 5: fragmented messages with pings between them; control frames and
    continuations out of place."""
    two = (text("fragment1", fin=False), wire(CONT, b"fragment2"))
    with_ping = (text("fragment1", fin=False), wire(PING, b"ping"), wire(CONT, b"fragment2"))
    cont_first = (wire(CONT, b"fragment1"), text("fragment2"), wire(CONT, b"fragment3"))
    cont_open = (wire(CONT, b"fragment1", fin=False), text("fragment2"),
                 wire(CONT, b"fragment3"))  # fmt: skip
    joined = ("text", "fragment1fragment2")
    five = tuple(
        f
        for i in range(1, 6)
        for f in (
            wire(CONT if i > 1 else TEXT, b"fragment%d" % i, fin=i == 5),
            wire(PING, b"pongme %d!" % i),
        )
    )
    five_answer: tuple[Event, ...] = (
        *(("pong", b"pongme %d!" % i) for i in range(1, 5)),
        ("text", "fragment1fragment2fragment3fragment4fragment5"),
        ("pong", b"pongme 5!"),
    )
    return [
        Case("5.1", (wire(PING, b"fragment1", fin=False), wire(CONT, b"fragment2")), close=1002),
        Case("5.2", (wire(PONG, b"fragment1", fin=False), wire(CONT, b"fragment2")), close=1002),
        Case("5.3", two, (joined,)),
        Case("5.4", (b"".join(two),), (joined,)),
        Case("5.5", chops(b"".join(two), 1), (joined,)),
        Case("5.6", with_ping, (("pong", b"ping"), joined)),
        Case("5.7", (b"".join(with_ping),), (("pong", b"ping"), joined)),
        Case("5.8", chops(b"".join(with_ping), 1), (("pong", b"ping"), joined)),
        Case("5.9", cont_first, close=1002),
        Case("5.10", (b"".join(cont_first),), close=1002),
        Case("5.11", chops(b"".join(cont_first), 1), close=1002),
        Case("5.12", cont_open, close=1002),
        Case("5.13", (b"".join(cont_open),), close=1002),
        Case("5.14", chops(b"".join(cont_open), 1), close=1002),
        Case(
            "5.15",
            (*two, wire(CONT, b"fragment3", fin=False), text("fragment4")),
            (joined,),
            close=1002,
        ),
        Case("5.16", cont_open * 2, close=1002),
        Case("5.17", cont_first * 2, close=1002),
        Case("5.18", (text("fragment1", fin=False), text("fragment2")), close=1002),
        Case("5.19", five, five_answer),
        Case("5.20", chops(b"".join(five), 7), five_answer),
    ]


KOSME = bytes.fromhex("cebae1bdb9cf83cebcceb5")
"""κόσμε: Markus Kuhn's first test sequence."""

UTF8_ROWS: list[tuple[str, str, bool]] = [
    # 6.5 (some valid UTF-8 sequences), 6.7 (first possible sequence of each length)
    ("6.5.1", "cebae1bdb9cf83cebcceb5", True),
    ("6.5.2", "e282ac", True),
    ("6.5.3", "f09d849e", True),
    ("6.5.4", "48656c6c6f00776f726c64", True),
    ("6.5.5", "cebae1bdb9cf83cebcceb5e282acf09d849e", True),
    ("6.7.1", "00", True),
    ("6.7.2", "c280", True),
    ("6.7.3", "e0a080", True),
    ("6.7.4", "f0908080", True),
    # 6.8 (five and six byte forms), 6.9 (last possible of each length), 6.10 (beyond)
    ("6.8.1", "f888808080", False),
    ("6.8.2", "fc8480808080", False),
    ("6.9.1", "7f", True),
    ("6.9.2", "dfbf", True),
    ("6.9.3", "efbfbf", True),
    ("6.9.4", "f48fbfbf", True),
    ("6.10.1", "f7bfbfbf", False),
    ("6.10.2", "fbbfbfbfbf", False),
    ("6.10.3", "fdbfbfbfbfbf", False),
    # 6.11 other boundaries
    ("6.11.1", "ed9fbf", True),
    ("6.11.2", "ee8080", True),
    ("6.11.3", "efbfbd", True),
    ("6.11.4", "f48fbfbf", True),
    ("6.11.5", "f4908080", False),
    # 6.12 unexpected continuation bytes
    ("6.12.1", "80", False),
    ("6.12.2", "bf", False),
    ("6.12.3", "80bf", False),
    ("6.12.4", "80bf80", False),
    ("6.12.5", "80bf80bf", False),
    ("6.12.6", "80bf80bf80", False),
    ("6.12.7", "80bf80bf80bf", False),
    ("6.12.8", bytes(range(0x80, 0xC0)).hex(), False),
    # 6.13 lonely start bytes, each followed by a space
    ("6.13.1", b"".join(bytes([b, 0x20]) for b in range(0xC0, 0xE0)).hex(), False),
    ("6.13.2", b"".join(bytes([b, 0x20]) for b in range(0xE0, 0xF0)).hex(), False),
    ("6.13.3", b"".join(bytes([b, 0x20]) for b in range(0xF0, 0xF8)).hex(), False),
    ("6.13.4", b"".join(bytes([b, 0x20]) for b in range(0xF8, 0xFC)).hex(), False),
    ("6.13.5", b"".join(bytes([b, 0x20]) for b in range(0xFC, 0xFE)).hex(), False),
    # 6.14 sequences without their last continuation byte
    ("6.14.1", "c0", False),
    ("6.14.2", "e080", False),
    ("6.14.3", "f08080", False),
    ("6.14.4", "f8808080", False),
    ("6.14.5", "fc80808080", False),
    ("6.14.6", "df", False),
    ("6.14.7", "efbf", False),
    ("6.14.8", "f7bfbf", False),
    ("6.14.9", "fbbfbfbf", False),
    ("6.14.10", "fdbfbfbfbf", False),
    # 6.15 the incomplete ones joined; 6.16 impossible bytes
    ("6.15.1", "c0e080f08080f8808080fc80808080dfefbff7bfbffbbfbfbffdbfbfbfbf", False),
    ("6.16.1", "fe", False),
    ("6.16.2", "ff", False),
    ("6.16.3", "fefeffff", False),
    # 6.17 overlong '/', 6.18 the largest overlong forms, 6.19 overlong NUL
    ("6.17.1", "c0af", False),
    ("6.17.2", "e080af", False),
    ("6.17.3", "f08080af", False),
    ("6.17.4", "f8808080af", False),
    ("6.17.5", "fc80808080af", False),
    ("6.18.1", "c1bf", False),
    ("6.18.2", "e09fbf", False),
    ("6.18.3", "f08fbfbf", False),
    ("6.18.4", "f887bfbfbf", False),
    ("6.18.5", "fc83bfbfbfbf", False),
    ("6.19.1", "c080", False),
    ("6.19.2", "e08080", False),
    ("6.19.3", "f0808080", False),
    ("6.19.4", "f880808080", False),
    ("6.19.5", "fc8080808080", False),
    # 6.20 single surrogates, 6.21 paired surrogates (never valid in UTF-8)
    *[
        (f"6.20.{i}", s, False)
        for i, s in enumerate(
            ("eda080", "edadbf", "edae80", "edafbf", "edb080", "edbe80", "edbfbf"), 1
        )
    ],
    *[
        (f"6.21.{i}", s, False)
        for i, s in enumerate(
            (
                "eda080edb080",
                "eda080edbfbf",
                "edadbfedb080",
                "edadbfedbfbf",
                "edae80edb080",
                "edae80edbfbf",
                "edafbfedb080",
                "edafbfedbfbf",
            ),
            1,
        )
    ],
    # 6.22 noncharacters (valid UTF-8: echoed), 6.23 the replacement character and others
    ("6.22.1", "efbfbe", True),
    ("6.22.2", "efbfbf", True),
    *[
        (f"6.22.{i}", chr(plane << 16 | low).encode().hex(), True)
        for i, (plane, low) in enumerate(
            ((p, low) for p in range(1, 17) for low in (0xFFFE, 0xFFFF)), 3
        )
    ],
    ("6.23.1", "efbfbd", True),
    ("6.23.2", "efbfbdefbfbd", True),
    ("6.23.3", "efbfbdefbfbdefbfbd", True),
    ("6.23.4", "efbbbf", True),
    ("6.23.5", "e280a8e280a9", True),
    ("6.23.6", "f4808080", True),
    ("6.23.7", "efbfbd" + "cebae1bdb9cf83cebcceb5", True),
]
"""(row, hex bytes, valid): each sent as one text frame's payload."""


def utf8() -> list[Case]:
    """Section 6: empty and valid text in every cut, invalid text failing with 1007,
    fail-fast across fragments, and Kuhn's sequences."""
    greeting = "Hello-µ@ßöäüàá-UTF-8!!".encode()
    rows = [
        Case("6.1.1", (text(b""),), (("text", ""),)),
        Case("6.1.2", (text(b"", fin=False), wire(CONT, fin=False), wire(CONT)), (("text", ""),)),
        Case(
            "6.1.3",
            (text(b"", fin=False), wire(CONT, b"middle frame payload", fin=False), wire(CONT)),
            (("text", "middle frame payload"),),
        ),
        Case("6.2.1", (text(greeting),), (("text", greeting.decode()),)),
        Case(
            "6.2.2",
            (text(greeting[:12], fin=False), wire(CONT, greeting[12:])),
            (("text", greeting.decode()),),
        ),
        Case(
            "6.2.3",
            tuple(
                wire(CONT if i else TEXT, greeting[i : i + 1], fin=i == len(greeting) - 1)
                for i in range(len(greeting))
            ),
            (("text", greeting.decode()),),
        ),
        Case("6.2.4", chops(text(KOSME * 3), 1), (("text", (KOSME * 3).decode()),)),
        Case("6.3.1", (text(KOSME + bytes.fromhex("eda080") + b"edited"),), close=1007),
        Case(
            "6.3.2",
            chops(text(KOSME + bytes.fromhex("eda080") + b"edited"), 1),
            close=1007,
        ),
        # fail-fast: the server closes after the fragment that holds the bad bytes,
        # before the rest is sent
        Case(
            "6.4.1",
            (text(KOSME, fin=False), wire(CONT, bytes.fromhex("f4908080"), fin=False)),
            close=1007,
        ),
        Case(
            "6.4.2",
            (text(KOSME + b"\xf4", fin=False), wire(CONT, b"\x90", fin=False)),
            close=1007,
        ),
        # whole frames are judged once whole: the 6.4.3-6.4.4 chops fail at the frame's end
        Case("6.4.3", chops(text(KOSME + bytes.fromhex("f4908080") + b"edited"), 5), close=1007),
        Case("6.4.4", chops(text(KOSME + b"\xf4\x90"), 4), close=1007),
    ]
    for i in range(1, len(KOSME) + 1):  # 6.6: every prefix of κόσμε, valid only on a boundary
        prefix = KOSME[:i]
        valid = i in (2, 5, 7, 9, 11)
        answer: tuple[Event, ...] = (("text", prefix.decode()),) if valid else ()
        rows.append(Case(f"6.6.{i}", (text(prefix),), answer, None if valid else 1007))
    for name, hexed, valid in UTF8_ROWS:
        data = bytes.fromhex(hexed)
        rows.append(
            Case(name, (text(data),), (("text", data.decode()),), None)
            if valid
            else Case(name, (text(data),), close=1007)
        )
    return rows


def closing() -> list[Case]:
    """Section 7: the close handshake, close payloads of every form, valid and invalid
    codes."""
    close_1000 = wire(CLOSE, close_payload(1000))
    rows = [
        Case("7.1.1", (text("Hello World!"), close_1000), (("text", "Hello World!"),), 1000),
        Case("7.1.2", (close_1000, close_1000), close=1000),
        Case("7.1.3", (close_1000, wire(PING)), close=1000),
        Case("7.1.4", (close_1000, text("after close")), close=1000),
        Case("7.1.5", (text("fragment1", fin=False), close_1000, wire(CONT, b"fragment2")),
             close=1000),
        Case("7.1.6", (text("BAsd7&jh23" * 26214 + "BAsd"), close_1000, wire(PING)),
             (("text", "BAsd7&jh23" * 26214 + "BAsd"),), 1000),
        Case("7.3.1", (wire(CLOSE),), close=1005),
        Case("7.3.2", (wire(CLOSE, b"a"),), close=1002),
        Case("7.3.3", (close_1000,), close=1000),
        Case("7.3.4", (wire(CLOSE, close_payload(1000, b"Hello World!")),), close=1000),
        Case("7.3.5", (wire(CLOSE, close_payload(1000, b"*" * 123)),), close=1000),
        Case("7.3.6", (wire(CLOSE, close_payload(1000, b"*" * 124)),), close=1002),
        Case("7.5.1", (wire(CLOSE, close_payload(1000, KOSME + bytes.fromhex("eda080"))),),
             close=1007),
    ]  # fmt: skip
    valid = (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999)
    for i, code in enumerate(valid, 1):
        rows.append(Case(f"7.7.{i}", (wire(CLOSE, close_payload(code)),), close=code))
    for i, code in enumerate((0, 999, 1004, 1005, 1006, 1016, 1100, 2000, 2999), 1):
        rows.append(Case(f"7.9.{i}", (wire(CLOSE, close_payload(code)),), close=1002))
    rows.append(Case("7.13.1", (wire(CLOSE, close_payload(5000)),), close=1002))
    rows.append(Case("7.13.2", (wire(CLOSE, close_payload(65535)),), close=1002))
    return rows


def gateway_rows() -> list[Case]:
    """The gateway's own: its size limit, unmasked frames, what precedes a break."""
    return [
        Case("G.1 a message over the limit", (text("x" * (LIMIT + 1)),), close=1009, waits=True),
        Case(
            "G.2 a fragmented message over the limit, a ping after it",
            (text("x" * LIMIT, fin=False), wire(CONT, b"y"), wire(PING, b"p")),
            close=1009,
            waits=True,
        ),
        Case("G.3 an unmasked frame", (text("hi", masked=False),), close=1002),
        Case(
            "G.4 a message, a ping and a broken frame in one write",
            (text("first") + wire(PING, b"p") + text("second", rsv=4),),
            (("text", "first"), ("pong", b"p")),
            1002,
        ),
        Case(
            "G.5 a message and invalid text in one write",
            (text("first") + text(b"\xff"),),
            (("text", "first"),),
            1007,
        ),
    ]


CASES = [
    *framing(),
    *pings(),
    *reserved_bits(),
    *opcodes(),
    *fragmentation(),
    *utf8(),
    *closing(),
    *gateway_rows(),
]


class Peer:
    """A client on a raw socket: the upgrade, then bytes out and server frames in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameProtocol(client=True, extensions=[])
        self.parts: list[str | bytes] = []

    @classmethod
    async def connect(cls, address: str) -> Peer:
        host, _, port = address.rpartition(":")
        peer = cls(await trio.open_tcp_stream(host, int(port)))
        await peer.stream.send_all(
            b"GET / HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % host.encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = await peer.stream.receive_some(4096)
            assert data, "the server ended the upgrade"
            answer += data
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 "), head
        peer.reader.receive_bytes(rest)
        return peer

    async def events(self) -> tuple[list[Event], int | None]:
        """What the server sends until its close frame (or the end of the connection):
        messages and pongs, and its close code."""
        events: list[Event] = []
        while True:
            for frame in self.reader.received_frames():
                if frame.opcode is Opcode.PONG:
                    events.append(("pong", bytes(frame.payload)))  # type: ignore[arg-type]
                elif frame.opcode is Opcode.CLOSE:
                    assert isinstance(frame.payload, tuple)
                    return events, int(frame.payload[0])
                else:
                    self.parts.append(frame.payload)  # type: ignore[arg-type]
                    if frame.message_finished:
                        if frame.opcode is Opcode.TEXT:
                            events.append(("text", "".join(self.parts)))  # type: ignore[arg-type]
                        else:
                            events.append(("binary", b"".join(self.parts)))  # type: ignore[arg-type]
                        self.parts = []
            data = await self.stream.receive_some(65536)
            if not data:
                return events, None
            self.reader.receive_bytes(data)

    async def ended(self) -> bool:
        """Whether the server ends the connection without a further byte from us."""
        with trio.move_on_after(5):
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    return True
        return False


@pytest.fixture
async def echo_address(nursery: trio.Nursery) -> AsyncIterator[str]:
    address: str = await nursery.start(
        lambda task_status: serve_echo(
            "127.0.0.1:0", max_message_bytes=LIMIT, task_status=task_status
        )
    )
    yield address


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_an_autobahn_case_gets_the_answer_rfc_6455_asks_for(
    echo_address: str, case: Case
) -> None:
    peer = await Peer.connect(echo_address)
    try:
        for data in case.send:
            try:
                await peer.stream.send_all(data)
            except trio.BrokenResourceError:
                break  # the server failed the connection before the rest (6.4.x)
        if case.close is None:  # the server waits for our close: it comes after the answer
            await peer.stream.send_all(wire(CLOSE, close_payload(1000)))
        events, code = await peer.events()

        assert events == list(case.answer)
        assert code == (1000 if case.close is None else case.close)
        if case.waits:  # the server closed first and waits for our close frame
            await peer.stream.send_all(wire(CLOSE, close_payload(1000)))
        assert await peer.ended(), "the server ends the connection after the close"
    finally:
        await peer.stream.aclose()
