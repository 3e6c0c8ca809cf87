"""A lean gateway client for benchmarks: RFC 6455 by hand over a Trio socket.

One client process holds thousands of connections, so a connection is a
socket, a buffer and one task (no WebSocket library's reader task and
channels); the server side is the real thing. Client frames are masked
(RFC 6455 section 5.3) with a fixed mask: the server must unmask, and nothing
here depends on the mask being random.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import trio

MASK = b"\x12\x34\x56\x78"


def masked_text(payload: bytes) -> bytes:
    """One masked client text frame."""
    length = len(payload)
    if length < 126:
        header = bytes([0x81, 0x80 | length])
    elif length < 65536:
        header = bytes([0x81, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0x80 | 127]) + length.to_bytes(8, "big")
    body = bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
    return header + MASK + body


def op_frame(frame: dict[str, Any]) -> bytes:
    """A client op as one masked text frame."""
    return masked_text(json.dumps(frame, separators=(",", ":")).encode())


PING = op_frame({"op": "ping"})
"""``{"op":"ping"}``, masked once for every connection."""


class Closed(Exception):
    """The server closed the connection (``code``: its close code, ``None``: no frame)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(f"closed ({code})")
        self.code = code


class RawGateway:
    """One client connection: upgrade, then whole server frames one at a time."""

    __slots__ = ("_buffer", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    @classmethod
    async def open(cls, host: str, port: int, path: str = "/v1/gateway") -> RawGateway:
        """Connect and upgrade; raises :class:`OSError` or :class:`Closed`."""
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        try:
            await sock.connect((host, port))  # an address: no resolver thread per connection
        except BaseException:
            sock.close()
            raise
        stream = trio.SocketStream(sock)
        conn = cls(stream)
        try:
            key = base64.b64encode(os.urandom(16))
            await stream.send_all(
                b"GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n" % (path.encode(), host.encode(), key)
            )
            while (end := conn._buffer.find(b"\r\n\r\n")) < 0:
                await conn._fill()
            if not conn._buffer.startswith(b"HTTP/1.1 101"):
                raise OSError("upgrade refused")
            del conn._buffer[: end + 4]
        except BaseException:
            await conn.aclose()
            raise
        return conn

    async def _fill(self) -> None:
        try:
            chunk = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            chunk = b""
        if not chunk:
            raise Closed(None)
        self._buffer += chunk

    async def frame(self) -> tuple[int, bytes]:
        """The next server frame as (opcode, payload); a close frame raises :class:`Closed`."""
        while True:
            buf = self._buffer
            if len(buf) >= 2:
                length, start = buf[1] & 0x7F, 2
                if length == 126:
                    start = 4
                elif length == 127:
                    start = 10
                if len(buf) >= start:
                    if start > 2:
                        length = int.from_bytes(buf[2:start], "big")
                    if len(buf) >= start + length:
                        opcode = buf[0] & 0x0F
                        payload = bytes(buf[start : start + length])
                        del buf[: start + length]
                        if opcode == 0x8:
                            code = int.from_bytes(payload[:2], "big") if payload else None
                            raise Closed(code)
                        return opcode, payload
            await self._fill()

    async def op(self) -> dict[str, Any]:
        """The next text frame's JSON object (control frames are skipped)."""
        while True:
            opcode, payload = await self.frame()
            if opcode == 0x1:
                decoded: dict[str, Any] = json.loads(payload)
                return decoded

    async def send(self, frame: bytes) -> None:
        """Send one pre-encoded frame; a broken connection raises :class:`Closed`."""
        try:
            await self.stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise Closed(None) from None

    async def identify(self, token: str) -> int:
        """hello -> identify -> catchup.complete; returns the hello's ``heartbeat_ms``."""
        hello = await self.op()
        await self.send(op_frame({"op": "identify", "d": {"token": token}}))
        while (await self.op()).get("op") != "catchup.complete":
            pass
        return int(hello["d"]["heartbeat_ms"])

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
