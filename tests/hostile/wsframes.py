"""Raw WebSocket client frames: whatever bytes a hostile client may put in one."""

from __future__ import annotations

import os

OPCODE_TEXT = 0x1
OPCODE_BINARY = 0x2


def client_frame(payload: bytes, *, opcode: int = OPCODE_TEXT, fin: bool = True) -> bytes:
    """One masked client frame carrying exactly ``payload`` (valid UTF-8 or not)."""
    mask = os.urandom(4)
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65_536:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
