"""The byte stream under trio-websocket: oversized client messages never reach the library.

Property: however the bytes are cut into chunks, the stream passes the HTTP
upgrade, control frames and every frame of messages within the limit
unchanged, swallows whole the frame that takes a message past the limit and
the rest of that message, and reports it once.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.frame_protocol import FrameProtocol

from gateway.transport import FramedStream

LIMIT = 300
UPGRADE = b"GET /v1/gateway HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"


def encode(messages: list[list[int]]) -> tuple[bytes, bytes, bool]:
    """Client bytes for ``messages`` (each a list of fragment sizes) and what should pass:
    every fragment until the one that takes its message past the limit.

    A ping is sent between fragments, as control frames may interleave.
    """
    protocol = FrameProtocol(client=True, extensions=[])
    sent, passed, oversized = bytearray(UPGRADE), bytearray(UPGRADE), False
    for fragments in messages:
        total = 0
        for i, size in enumerate(fragments):
            frame = bytes(protocol.send_data(b"x" * size, fin=i == len(fragments) - 1))
            total += size
            sent += frame
            if total <= LIMIT:
                passed += frame
            else:
                oversized = True
            ping = bytes(protocol.ping(b"p"))
            sent += ping
            passed += ping
    return bytes(sent), bytes(passed), oversized


def feed(data: bytes, cuts: list[int]) -> tuple[bytes, FramedStream, list[Any]]:
    stream = FramedStream(None, LIMIT)  # type: ignore[arg-type]  # _filter never touches it
    calls: list[Any] = []
    stream.on_oversized = lambda: calls.append(1)
    out = bytearray()
    start = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > start:
            out += stream._filter(data[start:cut])
            start = cut
    return bytes(out), stream, calls


fragment_sizes = st.lists(
    st.sampled_from([0, 1, 125, 126, 127, 200, 299, 300, 301, 70_000]), min_size=1, max_size=3
)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(fragment_sizes, max_size=4), cuts=st.lists(st.integers(0, 10**6)))
def test_only_frames_past_the_limit_of_their_message_are_held_back(
    messages: list[list[int]], cuts: list[int]
) -> None:
    sent, passed, oversized = encode(messages)

    out, stream, calls = feed(sent, cuts)

    assert out == passed
    assert stream.oversized is oversized
    assert calls == ([1] if oversized else [])


def test_a_message_exactly_at_the_limit_passes() -> None:
    sent, passed, oversized = encode([[LIMIT]])

    out, stream, _ = feed(sent, [])

    assert out == passed == sent and not oversized and not stream.oversized


@settings(max_examples=100, deadline=None)
@given(
    kinds=st.lists(st.booleans(), min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 10**6)),
)
def test_text_messages_reach_the_library_as_binary_and_are_remembered_as_text(
    kinds: list[bool], cuts: list[int]
) -> None:
    """So the library never judges UTF-8 (it would close with 1007, not 4003)."""
    protocol = FrameProtocol(client=True, extensions=[])
    sent = bytearray(UPGRADE)
    for is_text in kinds:
        # Two fragments each, so continuation frames are seen too.
        sent += protocol.send_data("ab" if is_text else b"ab", fin=False)
        sent += protocol.send_data("cd" if is_text else b"cd", fin=True)

    out, stream, _ = feed(bytes(sent), cuts)

    server = FrameProtocol(client=False, extensions=[])
    server.receive_bytes(out[len(UPGRADE) :])
    frames = list(server.received_frames())
    assert [f.opcode.value for f in frames] == [2, 2] * len(kinds)  # binary messages
    assert [f.payload for f in frames] == [b"ab", b"cd"] * len(kinds)
    assert [stream.was_text() for _ in kinds] == kinds
    assert stream.was_text() is False  # nothing more was passed on
