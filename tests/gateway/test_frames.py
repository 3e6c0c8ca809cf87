"""The frame filter without sockets: client bytes in, messages and control frames out.

Properties, however the bytes are cut (byte by byte included):
- the filter answers what wsproto's ``FrameProtocol`` (the server's side)
  answers on the same bytes: the same messages, pings and close frame, and the
  same code when the bytes break RFC 6455 (1002) or text is not UTF-8 (1007),
  for well-formed streams, for any frame header (masked or not, every opcode,
  RSV bits, 7/16/64-bit lengths and the 64-bit MSB), for text whose UTF-8 is
  split across fragments or invalid anywhere, and for close payloads of every
  length and code;
- where the gateway differs on purpose, :data:`DIFFERENCES` says how and why
  (docs/protocol.md, "WebSocket conformance", mirrors it), and a test pins
  each;
- only the frames of a message past the limit are skipped, and that is told
  once; control frames still come through;
- past the token bucket the connection is told once and only the peer's
  close frame comes through after it.
"""

from __future__ import annotations

from pathlib import Path
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

DIFFERENCES: dict[str, str] = {
    "size limit": "a message over sync.max_frame_bytes is TOO_LARGE (the gateway closes "
    "with 1009) and its frames are skipped unread; wsproto has no limit",
    "token bucket": "frames past sync.ops_per_second/ops_burst are TOO_MANY (4029) and only "
    "a close frame is told after them; wsproto counts nothing",
    "close code 1014": "accepted (IANA's 'Bad Gateway', registered after RFC 6455); "
    "wsproto 1.3 refuses it with 1002 (its CloseReason lacks 1014)",
    "whole frames": "a data frame is passed on once whole, so text that is not UTF-8 inside "
    "one frame fails when the frame is complete; wsproto hands out (and judges) a "
    "frame's bytes as they arrive. Only a stream cut inside a frame tells them apart "
    "(Autobahn 6.4.3 and 6.4.4: non-strict)",
    "after a close frame": "the filter goes on reading after the peer's close frame (the "
    "transport stops at it); wsproto reads nothing after it",
}
"""Where the filter deliberately differs from wsproto's decoder, and why. Both refuse
unmasked client frames (1002): that is not a difference."""


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


close_codes = st.one_of(
    st.integers(0, 65535),
    st.sampled_from([999, 1000, 1004, 1005, 1006, 1012, 1013, 1015, 1016, 2999, 3000, 4999, 5000]),
)
reasons = st.one_of(
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=123),
)


@settings(max_examples=300, deadline=None)
@given(code=close_codes, reason=reasons, cuts=st.lists(st.integers(0, 200), max_size=4))
def test_close_payloads_of_every_code_and_reason_are_judged_as_wsproto_judges_them(
    code: int, reason: bytes, cuts: list[int]
) -> None:
    payload = (code.to_bytes(2, "big") + reason)[:125]
    data = bytes([0x88, 0x80 | len(payload)]) + b"\x01\x02\x03\x04"
    data += bytes(b ^ (1, 2, 3, 4)[i % 4] for i, b in enumerate(payload))

    got = fed(data, cuts)

    if code == 1014:  # DIFFERENCES["close code 1014"]
        assert oracle(data) == [Broken(1002)]
        assert got == [_close_of(payload)]
    else:
        assert got == oracle(data)


def _close_of(payload: bytes) -> CloseFrame | Broken:
    try:
        return CloseFrame(int.from_bytes(payload[:2], "big"), payload[2:].decode())
    except UnicodeDecodeError:
        return Broken(1007)


@settings(max_examples=100, deadline=None)
@given(length=st.sampled_from([1, 2, 126, 127]), cuts=st.lists(st.integers(0, 200), max_size=3))
def test_a_close_payload_of_one_byte_or_past_a_control_frame_is_refused_as_wsproto_does(
    length: int, cuts: list[int]
) -> None:
    payload = (1000).to_bytes(2, "big") + b"r" * 200
    if length < 126:
        head = bytes([0x88, 0x80 | length])
    else:
        head = bytes([0x88, 0x80 | 126]) + length.to_bytes(2, "big")
    data = bytes(client().send_data("before")) + head + b"\x00\x00\x00\x00" + payload[:length]

    assert fed(data, cuts) == oracle(data)
    assert oracle(data)[-1] == (CloseFrame(1000, "") if length == 2 else Broken(1002))


utf8_texts = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=30
)
damage = st.sampled_from(
    ["none", "truncated at the end", "lone continuation", "surrogate", "overlong", "ff", "f4 90"]
)


def damaged(text: str, how: str, at: int) -> bytes:
    """``text`` as UTF-8, broken ``how`` (at byte ``at``, or at the end)."""
    data = text.encode()
    at = at % (len(data) + 1)
    bad = {
        "lone continuation": b"\x80",
        "surrogate": b"\xed\xa0\x80",
        "overlong": b"\xc0\xaf",
        "ff": b"\xff",
        "f4 90": b"\xf4\x90\x80\x80",
    }
    if how == "none":
        return data
    if how == "truncated at the end":
        return data + "é€😀".encode()[: 1 + at % 6]  # a character cut short
    return data[:at] + bad[how] + data[at:]


@settings(max_examples=300, deadline=None)
@given(
    text=utf8_texts,
    how=damage,
    at=st.integers(0, 200),
    splits=st.lists(st.integers(0, 200), max_size=4),
    ping_between=st.booleans(),
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
)
def test_text_split_anywhere_across_fragments_is_judged_as_wsproto_judges_it(
    text: str, how: str, at: int, splits: list[int], ping_between: bool, cuts: list[int]
) -> None:
    """UTF-8 cut between fragments (inside a character too), valid or broken
    anywhere, pings between the fragments: the same messages and the same 1007."""
    payload = damaged(text, how, at)
    bounds = sorted({s % (len(payload) + 1) for s in splits})
    pieces = [payload[a:b] for a, b in zip([0, *bounds], [*bounds, len(payload)], strict=True)]
    data = b""
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        data += raw_payload_frame(0x1 if i == 0 else 0x0, piece, fin=last)
        if ping_between and not last:
            data += bytes(client().ping(b"between"))
    data += bytes(client().send_data("after")) + bytes(client().close(1000, "bye"))

    assert until_close(fed(data, cuts)) == oracle(data)


def raw_payload_frame(opcode: int, payload: bytes, *, fin: bool) -> bytes:
    """A masked client frame of any payload (wsproto's encoder only takes valid text)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + b"\x00\x00\x00\x00" + payload


def test_invalid_text_inside_one_frame_fails_once_the_frame_is_whole() -> None:
    """DIFFERENCES["whole frames"]: wsproto fails on the bytes it has; the filter waits
    for the frame, then fails with the same code."""
    data = raw_payload_frame(0x1, "κόσμε".encode() + b"\xf4\x90\x80\x80edited", fin=True)
    filt = FrameFilter(LIMIT)

    assert oracle(data[:-3]) == [Broken(1007)]
    assert filt.feed(data[:-3]) == []
    assert filt.feed(data[-3:]) == [Broken(1007)] == oracle(data)


def test_invalid_text_in_a_fragment_fails_at_that_fragment_before_the_next() -> None:
    """Fail-fast across fragments, as wsproto: a ping after the bad fragment is never told."""
    data = raw_payload_frame(0x1, b"ok", fin=False) + raw_payload_frame(0x0, b"\xc0", fin=False)
    data += bytes(client().ping(b"after"))

    assert fed(data, []) == oracle(data) == [Broken(1007)]


def test_the_filter_reads_on_after_a_close_frame_where_wsproto_stops() -> None:
    """DIFFERENCES["after a close frame"]: the transport stops reading at the close."""
    data = bytes(client().close(1000, "bye")) + bytes(client().ping(b"late"))

    assert oracle(data) == [CloseFrame(1000, "bye")]
    assert fed(data, []) == [CloseFrame(1000, "bye"), PingFrame(b"late")]


def test_the_differences_are_the_ones_docs_protocol_lists() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")

    for name in DIFFERENCES:
        assert f"**{name}**" in doc, name


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
