"""The frame filter without sockets: client bytes in, messages and control frames out.

Properties, however the bytes are cut (byte by byte included):
- the filter answers what wsproto's frame decoder answers on the same bytes,
  for well-formed streams and for streams that break RFC 6455 anywhere (the
  close code included);
- only the frames of a message past the limit are skipped, and that is told
  once; control frames still come through;
- past the token bucket the connection is told once and only the peer's
  close frame comes through after it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol, Opcode, ParseFailed

from gateway.frames import (
    TOO_LARGE,
    TOO_MANY,
    Broken,
    CloseFrame,
    FrameFilter,
    Inbound,
    Message,
    PingFrame,
    TokenBucket,
    close_frame,
    pong_frame,
    text_frame,
)

LIMIT = 300


def client() -> FrameProtocol:
    return FrameProtocol(client=True, extensions=[])


def fed(data: bytes, cuts: list[int], filt: FrameFilter | None = None) -> list[Inbound]:
    """Everything the filter answers for ``data`` cut at ``cuts``."""
    filt = filt or FrameFilter(10**9)
    out: list[Inbound] = []
    start = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > start:
            out += filt.feed(data[start:cut])
            start = cut
    return out


def bytewise(data: bytes, filt: FrameFilter) -> list[Inbound]:
    out: list[Inbound] = []
    for i in range(len(data)):
        out += filt.feed(data[i : i + 1])
    return out


def oracle(data: bytes) -> list[Any]:
    """What wsproto's server-side decoder makes of ``data``, as the filter's events:
    whole messages, pings, the first close frame, and the code it fails with."""
    server = FrameProtocol(client=False, extensions=[])
    server.receive_bytes(data)
    out: list[Any] = []
    parts: list[Any] = []
    try:
        for f in server.received_frames():
            if f.opcode is Opcode.PING:
                out.append(PingFrame(bytes(f.payload)))  # type: ignore[arg-type]
            elif f.opcode is Opcode.CLOSE:
                assert isinstance(f.payload, tuple)
                code, reason = f.payload
                out.append(CloseFrame(int(code), reason))
                break
            elif f.opcode is not Opcode.PONG:
                parts.append(f.payload)
                if f.message_finished:
                    text = f.opcode is Opcode.TEXT
                    out.append(Message("".join(parts) if text else b"".join(parts)))
                    parts = []
    except ParseFailed as exc:
        out.append(Broken(int(exc.code)))
    return out


def until_close(events: list[Inbound]) -> list[Inbound]:
    """Events up to the first close frame (wsproto reads nothing after one)."""
    for i, event in enumerate(events):
        if isinstance(event, CloseFrame | Broken):
            return events[: i + 1]
    return events


# -- well-formed streams ------------------------------------------------------------

fragments = st.lists(st.sampled_from([0, 1, 5, 125, 126, 127, 300, 70_000]), min_size=1, max_size=3)
pieces = st.one_of(
    st.tuples(st.just("text"), fragments),
    st.tuples(st.just("binary"), fragments),
    st.tuples(st.just("ping"), st.binary(max_size=125)),
    st.tuples(st.just("pong"), st.binary(max_size=125)),
)


def encode(items: list[tuple[str, Any]], *, ping_between: bool = True) -> bytes:
    protocol = client()
    out = bytearray()
    for kind, arg in items:
        if kind == "ping":
            out += protocol.ping(arg)
        elif kind == "pong":
            out += protocol.pong(arg)
        else:
            for i, size in enumerate(arg):
                data: str | bytes = "é" * (size // 2) + "x" * (size % 2)
                if kind == "binary":
                    data = b"\xff" * size
                out += protocol.send_data(data, fin=i == len(arg) - 1)
                if ping_between and i < len(arg) - 1:
                    out += protocol.ping(b"between")
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(pieces, max_size=5), cuts=st.lists(st.integers(0, 10**6), max_size=8))
def test_well_formed_streams_come_out_as_wsproto_reads_them_however_cut(
    items: list[tuple[str, Any]], cuts: list[int]
) -> None:
    data = encode(items) + bytes(client().close(1000, "bye"))

    assert fed(data, cuts) == oracle(data)


def test_a_stream_fed_byte_by_byte_gives_the_same_events() -> None:
    data = encode([("text", [5, 126, 1]), ("ping", b"p"), ("binary", [127])])
    data += bytes(client().close(4000, "done"))

    assert bytewise(data, FrameFilter(10**6)) == fed(data, []) == oracle(data)


# -- streams that break the framing -----------------------------------------------

headers = st.tuples(
    st.booleans(),  # fin
    st.integers(0, 7),  # rsv bits
    st.integers(0, 15),  # opcode
    st.booleans(),  # masked
    st.sampled_from(["short", "two", "eight", "two-short", "eight-short", "eight-msb"]),
    st.integers(0, 200),  # payload length (short forms cap it)
)


def raw_frame(fin: bool, rsv: int, opcode: int, masked: bool, form: str, size: int) -> bytes:
    """A client frame with any header, its payload ASCII (text stays UTF-8)."""
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    mask_bit = 0x80 if masked else 0
    if form == "short":
        size = min(size, 125)
        head = bytes([first, mask_bit | size])
    elif form == "two":
        size = max(size, 126)
        head = bytes([first, mask_bit | 126]) + size.to_bytes(2, "big")
    elif form == "two-short":
        size = min(size, 125)
        head = bytes([first, mask_bit | 126]) + size.to_bytes(2, "big")
    elif form == "eight":
        size = 65536 + size
        head = bytes([first, mask_bit | 127]) + size.to_bytes(8, "big")
    elif form == "eight-short":
        head = bytes([first, mask_bit | 127]) + size.to_bytes(8, "big")
    else:
        head = bytes([first, mask_bit | 127]) + (size | 1 << 63).to_bytes(8, "big")
        size = 4
    payload = b"a" * size
    if opcode == 0x8 and size >= 2:
        payload = (1000).to_bytes(2, "big") + payload[2:]
    return head + (b"\x00\x00\x00\x00" if masked else b"") + payload


@settings(max_examples=400, deadline=None)
@given(
    prefix=st.lists(pieces, max_size=2),
    bad=st.lists(headers, min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
)
def test_any_frame_headers_are_judged_as_wsproto_judges_them(
    prefix: list[tuple[str, Any]], bad: list[tuple[Any, ...]], cuts: list[int]
) -> None:
    data = encode(prefix, ping_between=False) + b"".join(raw_frame(*h) for h in bad)
    expected = oracle(data)

    got = until_close(fed(data, cuts))

    if expected and isinstance(expected[-1], Broken):
        assert got == expected
    else:  # wsproto may still wait for bytes of the last frame: compare what is whole
        assert got == expected[: len(got)] and len(got) >= len(expected) - 1


CLOSES = [
    (b"", CloseFrame(1005, "")),
    (b"\x03", Broken(1002)),
    ((999).to_bytes(2, "big"), Broken(1002)),
    ((1004).to_bytes(2, "big"), Broken(1002)),
    ((1005).to_bytes(2, "big"), Broken(1002)),
    ((1006).to_bytes(2, "big"), Broken(1002)),
    ((1015).to_bytes(2, "big"), Broken(1002)),
    ((2000).to_bytes(2, "big"), Broken(1002)),
    ((5000).to_bytes(2, "big"), Broken(1002)),
    ((1013).to_bytes(2, "big") + b"later", CloseFrame(1013, "later")),
    ((4999).to_bytes(2, "big"), CloseFrame(4999, "")),
    ((1000).to_bytes(2, "big") + b"\xff", Broken(1007)),
]


def test_close_payloads_are_judged_as_wsproto_judges_them() -> None:
    for payload, event in CLOSES:
        data = bytes([0x88, 0x80 | len(payload)]) + b"\x00\x00\x00\x00" + payload

        assert fed(data, []) == oracle(data) == [event], payload


def test_nothing_is_read_after_the_framing_broke() -> None:
    filt = FrameFilter(LIMIT)
    unmasked = bytes(FrameProtocol(client=False, extensions=[]).send_data("hi"))

    assert filt.feed(unmasked) == [Broken(1002)]
    assert filt.feed(bytes(client().send_data("after"))) == []


# -- the size limit ----------------------------------------------------------------


def limited(messages: list[list[int]]) -> tuple[bytes, list[Inbound]]:
    """Client bytes for ``messages`` (fragment sizes), a ping after each fragment, and
    what the filter must answer: messages within the limit, TOO_LARGE once, pings."""
    protocol = client()
    sent = bytearray()
    expected: list[Inbound] = []
    told = False
    for sizes in messages:
        total, over = 0, False
        for i, size in enumerate(sizes):
            sent += protocol.send_data(b"x" * size, fin=i == len(sizes) - 1)
            total += size
            if total > LIMIT and not over:
                over = True
                if not told:
                    expected.append(TOO_LARGE)
                    told = True
            if i == len(sizes) - 1 and not over:
                expected.append(Message(b"x" * total))
            sent += protocol.ping(b"p")
            expected.append(PingFrame(b"p"))
    return bytes(sent), expected


fragment_sizes = st.lists(
    st.sampled_from([0, 1, 125, 126, 127, 200, 299, 300, 301, 70_000]), min_size=1, max_size=3
)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(fragment_sizes, max_size=4), cuts=st.lists(st.integers(0, 10**6)))
def test_only_frames_past_the_limit_of_their_message_are_skipped(
    messages: list[list[int]], cuts: list[int]
) -> None:
    sent, expected = limited(messages)
    filt = FrameFilter(LIMIT)

    assert fed(sent, cuts, filt) == expected
    assert filt.oversized is (TOO_LARGE in expected)


def test_a_message_exactly_at_the_limit_passes_and_one_byte_more_does_not() -> None:
    at, _ = limited([[LIMIT]])
    over, _ = limited([[LIMIT + 1]])

    assert FrameFilter(LIMIT).feed(at)[0] == Message(b"x" * LIMIT)
    assert FrameFilter(LIMIT).feed(over)[0] is TOO_LARGE


def test_an_oversized_frame_is_skipped_as_it_arrives_never_buffered() -> None:
    filt = FrameFilter(LIMIT)
    data = bytes(client().send_data(b"y" * 1_000_000))

    assert filt.feed(data[:100]) == [TOO_LARGE]
    for start in range(100, len(data), 65536):
        assert filt.feed(data[start : start + 65536]) == []
        assert len(filt._rest) == 0  # nothing of it is kept
    assert filt.feed(bytes(client().ping(b"after"))) == [PingFrame(b"after")]


# -- the token bucket ------------------------------------------------------------------


def test_the_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=10, burst=50)

    assert all(bucket.take(0.0) for _ in range(50))
    assert not bucket.take(0.0)
    assert bucket.take(0.1) and not bucket.take(0.1)  # one token back per 100 ms
    assert sum(bucket.take(10.0) for _ in range(100)) == 50  # never more than the burst
    assert not bucket.take(5.0)  # a clock that steps back gives nothing back


PING_OP = bytes(client().send_data('{"op":"ping"}'))


def test_frames_past_the_bucket_are_told_once_and_only_a_close_comes_after() -> None:
    filt = FrameFilter(LIMIT, TokenBucket(rate=10, burst=3))
    ping = bytes(client().ping(b"p"))

    events = filt.feed(PING_OP * 2 + ping + PING_OP + ping, now=0.0)

    assert events == [
        Message('{"op":"ping"}'),
        Message('{"op":"ping"}'),
        PingFrame(b"p"),
        TOO_MANY,
    ]
    assert filt.flooded
    assert filt.feed(PING_OP, now=100.0) == []  # flooded for good
    assert filt.feed(bytes(client().close(1000, "ok")), now=100.0) == [CloseFrame(1000, "ok")]


def test_every_fragment_and_control_frame_takes_a_token() -> None:
    filt = FrameFilter(LIMIT, TokenBucket(rate=1, burst=4))
    protocol = client()
    data = bytes(protocol.send_data("a", fin=False)) + bytes(protocol.pong(b""))
    data += bytes(protocol.send_data("b", fin=False)) + bytes(protocol.send_data("c", fin=True))

    assert filt.feed(data, now=0.0) == [Message("abc")]
    assert filt.feed(bytes(protocol.ping(b"")), now=0.0) == [TOO_MANY]


def test_bytes_cut_mid_frame_take_one_token_per_frame() -> None:
    filt = FrameFilter(LIMIT, TokenBucket(rate=0.001, burst=2))

    assert bytewise(PING_OP * 2, filt) == [Message('{"op":"ping"}')] * 2
    assert filt.feed(PING_OP) == [TOO_MANY]


# -- the server's frames ------------------------------------------------------------


def test_server_frames_are_what_wsproto_reads() -> None:
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(
        text_frame("héllo")
        + text_frame("x" * 70_000)
        + text_frame("y" * 200)
        + pong_frame(b"beat")
        + close_frame(4029, "too many frames")
    )
    frames = list(reader.received_frames())

    assert [(f.opcode, f.payload) for f in frames] == [
        (Opcode.TEXT, "héllo"),
        (Opcode.TEXT, "x" * 70_000),
        (Opcode.TEXT, "y" * 200),
        (Opcode.PONG, b"beat"),
        (Opcode.CLOSE, (4029, "too many frames")),
    ]


def test_a_close_reason_is_cut_to_what_a_control_frame_holds_never_inside_a_character() -> None:
    data = close_frame(4003, "é" * 100)
    reader = FrameProtocol(client=True, extensions=[])
    reader.receive_bytes(data)
    (f,) = reader.received_frames()

    assert len(data) <= 2 + 125
    assert f.payload == (4003, "é" * 61)
    assert close_frame(None) == close_frame(1005) == b"\x88\x00"
