"""The kit's WebSocket framing (``testkit/ws.py``) against wsproto, the reference: what
the client sends, wsproto reads as sent; what wsproto sends, the client reads as
sent, chunked any way; what RFC 6455 forbids a server to send, the client refuses."""

from __future__ import annotations

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, TextMessage
from wsproto.frame_protocol import FrameProtocol, Opcode

from testkit.ws import (
    OPCODE_BINARY,
    OPCODE_CLOSE,
    OPCODE_PING,
    OPCODE_TEXT,
    FrameReader,
    ProtocolError,
    client_frame,
    op_frame,
)

SIZES = [0, 1, 125, 126, 65535, 65536, 70000]
"""Payload lengths on each side of the 7-, 16- and 64-bit length forms."""


def server() -> Connection:
    return Connection(ConnectionType.SERVER)


def read_all(reader: FrameReader, data: bytes, chunk: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for at in range(0, len(data), chunk):
        out += reader.feed(data[at : at + chunk])
    return out


@pytest.mark.parametrize("size", SIZES)
def test_a_client_frame_reads_in_wsproto_as_the_bytes_sent(size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    text = "é" * (size // 2)
    ws = server()
    ws.receive_data(client_frame(payload, opcode=OPCODE_BINARY) + client_frame(text.encode()))
    binary, text_message = list(ws.events())
    assert isinstance(binary, BytesMessage) and binary.data == payload
    assert isinstance(text_message, TextMessage) and text_message.data == text


def test_an_op_frame_is_the_op_as_compact_json() -> None:
    ws = server()
    ws.receive_data(op_frame("focus", {"thread_ids": ["t1"]}) + op_frame("ping"))
    assert [e.data for e in ws.events() if isinstance(e, TextMessage)] == [
        '{"op":"focus","d":{"thread_ids":["t1"]}}',
        '{"op":"ping"}',
    ]


@pytest.mark.parametrize("chunk", [1, 3, 7, 65536])
def test_frames_wsproto_sends_read_as_sent_however_chunked(chunk: int) -> None:
    proto = FrameProtocol(client=False, extensions=[])  # a server's frames: unmasked
    close = (4003).to_bytes(2, "big") + b"malformed frame"  # the protocol's own code
    wire = b"".join(
        [
            proto.send_data("hello"),
            proto.send_data("frag", fin=False),  # a fragmented message ...
            proto.ping(b"between"),  # ... with a control frame between its fragments ...
            proto.send_data("mented ✓"),  # ... ends here
            proto.send_data(b"\x00" * 70000),
            bytes([0x80 | Opcode.CLOSE, len(close)]) + close,
        ]
    )
    assert read_all(FrameReader(), wire, chunk) == [
        (OPCODE_TEXT, b"hello"),
        (OPCODE_PING, b"between"),
        (OPCODE_TEXT, "fragmented ✓".encode()),
        (OPCODE_BINARY, b"\x00" * 70000),
        (OPCODE_CLOSE, close),
    ]


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("a masked server frame", bytes([0x81, 0x80 | 2]) + b"\x00\x00\x00\x00hi"),
        ("RSV1 set", bytes([0xC1, 2]) + b"hi"),
        ("a reserved data opcode", bytes([0x83, 0])),
        ("a reserved control opcode", bytes([0x8B, 0])),
        (
            "a control frame over 125 bytes",
            bytes([0x89, 126]) + (126).to_bytes(2, "big") + b"x" * 126,
        ),
        ("a fragmented control frame", bytes([0x09, 0])),
        ("a continuation with nothing to continue", bytes([0x80, 1]) + b"x"),
        (
            "a new message inside a fragmented one",
            bytes([0x01, 1]) + b"a" + bytes([0x81, 1]) + b"b",
        ),
        ("a 16-bit length under 126", bytes([0x82, 126]) + (5).to_bytes(2, "big") + b"x" * 5),
        ("a 64-bit length under 65536", bytes([0x82, 127]) + (200).to_bytes(8, "big") + b"x" * 200),
        ("the 64-bit length's top bit", bytes([0x82, 127]) + (1 << 63).to_bytes(8, "big")),
        ("text that is not UTF-8", bytes([0x81, 2]) + b"\xc3\x28"),
        ("UTF-8 cut at a fragment's end", bytes([0x01, 1]) + b"\xc3" + bytes([0x80, 0])),
        ("a one-byte close payload", bytes([0x88, 1]) + b"\x03"),
        ("close code 1005 on the wire", bytes([0x88, 2]) + (1005).to_bytes(2, "big")),
        ("close code 999", bytes([0x88, 2]) + (999).to_bytes(2, "big")),
        (
            "a close reason that is not UTF-8",
            bytes([0x88, 4]) + (1000).to_bytes(2, "big") + b"\xff\xfe",
        ),
    ],
)
def test_what_a_server_must_never_send_is_refused(name: str, wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        read_all(FrameReader(), wire, 65536)


def test_utf8_split_across_fragments_is_whole_text() -> None:
    snowman = "☃".encode()
    wire = bytes([0x01, 1]) + snowman[:1] + bytes([0x80, 2]) + snowman[1:]
    assert read_all(FrameReader(), wire, 1) == [(OPCODE_TEXT, snowman)]
