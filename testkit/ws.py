"""The gateway's WebSocket client for tests and benchmarks: RFC 6455 by hand over a
Trio socket.

One implementation, two ways to read:

- **pull** (:meth:`GatewayClient.open`): nothing reads until the caller does
  (:meth:`~GatewayClient.op`, :meth:`~GatewayClient.receive`,
  :meth:`~GatewayClient.read_until`). A connection is a socket, a buffer and no
  task, so one benchmark process holds tens of thousands of them; with a small
  ``receive_buffer`` and no reading, the server's writes stall within a few
  kilobytes (what the write-timeout tests need).
- **recording** (:meth:`GatewayClient.connect`): a task in the caller's nursery
  reads every message into :attr:`~GatewayClient.frames`, and tests wait for
  one (:meth:`~GatewayClient.wait_op`) or for the close
  (:meth:`~GatewayClient.wait_closed`).

The client is strict about what the server sends (RFC 6455 section 5): a masked
frame, a reserved bit or opcode, a control frame that is fragmented or longer
than 125 bytes, a length not in its shortest form, a continuation out of place,
a text message or close reason that is not UTF-8, or a wrong
``Sec-WebSocket-Accept`` raises :class:`ProtocolError`: a test that meets one
fails, whatever it was about. Pings are answered with pongs; a close frame is
answered with a close frame and the socket is closed (:class:`Closed` says
with which code; 1006 when the connection ended without one). Client frames are
masked (section 5.3): with a random mask by default, with a fixed one for
frames a benchmark encodes once (:data:`PING`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import struct
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import trio

OPCODE_CONTINUATION = 0x0
OPCODE_TEXT = 0x1
OPCODE_BINARY = 0x2
OPCODE_CLOSE = 0x8
OPCODE_PING = 0x9
OPCODE_PONG = 0xA
_DATA = frozenset({OPCODE_TEXT, OPCODE_BINARY})
_CONTROL = frozenset({OPCODE_CLOSE, OPCODE_PING, OPCODE_PONG})

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
"""RFC 6455 section 1.3: what ``Sec-WebSocket-Accept`` hashes with the key."""
NO_STATUS = 1005
"""The close code reported for a close frame without one (RFC 6455 section 7.1.5)."""
ABNORMAL = 1006
"""The close code reported when the connection ended without a close frame."""
MAX_HEAD = 65536
"""Bytes of the upgrade's answer read at most before giving up on it."""
READ_SIZE = 65536
"""Bytes asked of the socket per read."""
CLOSE_WAIT = 5.0
"""Seconds :meth:`GatewayClient.close` may take to send its close frame."""
POLL = 0.005
"""Seconds between two looks at the recorded frames (tests' waits)."""

Frame = dict[str, Any]
"""One gateway message: a JSON object."""


class ProtocolError(Exception):
    """The server broke RFC 6455 (the message says how)."""


class HandshakeRefused(OSError):
    """The server did not upgrade the connection (``status``: its HTTP status, 0
    when it ended the connection first)."""

    def __init__(self, status: int, head: bytes = b"") -> None:
        super().__init__(f"upgrade refused ({status})")
        self.status = status
        self.head = head


class Closed(Exception):
    """The connection ended: the server's close ``code`` and ``reason``
    (:data:`ABNORMAL` when it ended without a close frame)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"closed ({code})")
        self.code = code
        self.reason = reason


def client_frame(
    payload: bytes,
    *,
    opcode: int = OPCODE_TEXT,
    fin: bool = True,
    mask: bytes | None = None,
) -> bytes:
    """One masked client frame carrying exactly ``payload`` (valid UTF-8 or not):
    what a well-behaved client sends, or what a hostile one makes of it."""
    key = os.urandom(4) if mask is None else mask
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + size.to_bytes(8, "big")
    if not payload:
        return head + key
    # XOR with the mask repeated over the payload, as one big-integer operation.
    repeated = (key * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        size, "big"
    )
    return head + key + masked


def op_frame(op: str, d: Any = None, *, mask: bytes | None = None) -> bytes:
    """A gateway op (``{"op": OP, "d": D}``) as one masked text frame."""
    frame: Frame = {"op": op}
    if d is not None:
        frame["d"] = d
    return client_frame(json.dumps(frame, separators=(",", ":")).encode(), mask=mask)


PING = op_frame("ping", mask=b"\x12\x34\x56\x78")
"""``{"op":"ping"}``, encoded once for every connection (a fixed mask: the server
must unmask, and nothing depends on the mask being random)."""


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode()


class FrameReader:
    """Server frames out of received bytes, checked (see the module docstring).

    :meth:`feed` returns what the bytes completed, in order: whole data messages
    (a fragmented one put together) and control frames, each as
    ``(opcode, payload)``.
    """

    __slots__ = ("_buffer", "_fragments", "_message_opcode")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._message_opcode: int | None = None
        self._fragments: list[bytes] = []

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buffer
        buf += data
        out: list[tuple[int, bytes]] = []
        while len(buf) >= 2:
            first, second = buf[0], buf[1]
            if first & 0x70:
                raise ProtocolError("a reserved bit (RSV1-3) is set")
            if second & 0x80:
                raise ProtocolError("the server masked a frame")
            fin, opcode, length, start = bool(first & 0x80), first & 0x0F, second & 0x7F, 2
            if length == 126:
                start = 4
            elif length == 127:
                start = 10
            if len(buf) < start:
                break
            if start == 4:
                length = int.from_bytes(buf[2:4], "big")
                if length < 126:
                    raise ProtocolError("a 16-bit length where 7 bits would do")
            elif start == 10:
                length = int.from_bytes(buf[2:10], "big")
                if length >> 63:
                    raise ProtocolError("the most significant bit of a 64-bit length is set")
                if length < 65536:
                    raise ProtocolError("a 64-bit length where 16 bits would do")
            if len(buf) < start + length:
                break
            payload = bytes(buf[start : start + length])
            del buf[: start + length]
            message = self._frame(fin, opcode, payload)
            if message is not None:
                out.append(message)
        return out

    def _frame(self, fin: bool, opcode: int, payload: bytes) -> tuple[int, bytes] | None:
        if opcode in _CONTROL:
            if not fin or len(payload) > 125:
                raise ProtocolError("a control frame fragmented or over 125 bytes")
            if opcode == OPCODE_CLOSE:
                _close_of(payload)  # checked here, decoded by the client
            return opcode, payload
        if opcode == OPCODE_CONTINUATION:
            if self._message_opcode is None:
                raise ProtocolError("a continuation frame without a message to continue")
        elif opcode in _DATA:
            if self._message_opcode is not None:
                raise ProtocolError("a new message before the fragmented one ended")
            self._message_opcode = opcode
        else:
            raise ProtocolError(f"a reserved opcode ({opcode:#x})")
        self._fragments.append(payload)
        if not fin:
            return None
        kind, whole = self._message_opcode, b"".join(self._fragments)
        assert kind is not None
        self._message_opcode, self._fragments = None, []
        if kind == OPCODE_TEXT:
            try:
                whole.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("a text message that is not UTF-8") from None
        return kind, whole


def _close_of(payload: bytes) -> tuple[int, str]:
    """The code and reason of a close frame's payload (checked)."""
    if not payload:
        return NO_STATUS, ""
    if len(payload) == 1:
        raise ProtocolError("a close frame with a one-byte payload")
    code = int.from_bytes(payload[:2], "big")
    if code < 1000 or code in (1004, 1005, 1006, 1015) or 1016 <= code < 3000 or code >= 5000:
        raise ProtocolError(f"a close code no endpoint may send ({code})")
    try:
        return code, payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("a close reason that is not UTF-8") from None


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class GatewayClient:
    """One connection to the gateway (see the module docstring for the two ways
    to read).

    Attributes:
        stream: the socket (tests write raw bytes to it).
        frames: the JSON messages recorded so far (recording mode, and
            :meth:`read_until`).
        close_code, close_reason: the server's close, once the connection ended.
        ended: the connection ended (recording mode: the reader stopped).
    """

    __slots__ = (
        "_close_sent",
        "_pending",
        "_reader",
        "_recording",
        "_sending",
        "close_code",
        "close_reason",
        "ended",
        "frames",
        "stream",
    )

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._reader = FrameReader()
        self._pending: deque[tuple[int, bytes]] = deque()
        self._close_sent = False
        self._recording = False
        self._sending = trio.Lock()
        self.frames: list[Frame] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.ended = False

    def __repr__(self) -> str:
        return f"GatewayClient(frames={len(self.frames)}, close_code={self.close_code})"

    # -- opening ------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, address: str, *, path: str = "/v1/gateway", receive_buffer: int | None = None
    ) -> GatewayClient:
        """Connect to ``host:port`` and upgrade (pull mode).

        ``receive_buffer``: the socket's ``SO_RCVBUF`` (small: the server's writes
        stall soon when nothing reads).

        Raises:
            OSError: the connection failed; :class:`HandshakeRefused` when the
                server answered the upgrade with anything but 101.
            ProtocolError: a 101 with a wrong ``Sec-WebSocket-Accept``.
        """
        host, port = _split(address)
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            if receive_buffer is not None:
                sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
            # An address, not a name: no resolver thread per connection.
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        client = cls(trio.SocketStream(sock))
        try:
            await client._upgrade(host, path)
        except BaseException:
            await client.aclose()
            raise
        return client

    @classmethod
    async def connect(
        cls, nursery: trio.Nursery, address: str, *, path: str = "/v1/gateway"
    ) -> GatewayClient:
        """:meth:`open`, then record every message in a task of ``nursery``."""
        client = await cls.open(address, path=path)
        client._recording = True
        nursery.start_soon(client._record)
        return client

    async def _upgrade(self, host: str, path: str) -> None:
        key = base64.b64encode(os.urandom(16))
        await self.stream.send_all(
            b"GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (path.encode(), host.encode(), key)
        )
        seen = b""
        while (end := seen.find(b"\r\n\r\n")) < 0:
            chunk = await self._read_some()
            if not chunk or len(seen) > MAX_HEAD:
                raise HandshakeRefused(0, seen)
            seen += chunk
        head, rest = seen[:end], seen[end + 4 :]
        status_line, *header_lines = head.split(b"\r\n")
        parts = status_line.split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status != 101:
            raise HandshakeRefused(status, head)
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(b":") for line in header_lines)
        }
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        if headers.get(b"sec-websocket-accept") != accept:
            raise ProtocolError("a wrong Sec-WebSocket-Accept")
        self._pending.extend(self._reader.feed(rest))

    # -- reading ------------------------------------------------------------------------

    async def _read_some(self) -> bytes:
        try:
            return await self.stream.receive_some(READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def receive(self) -> list[tuple[int, bytes]]:
        """The data messages that one read from the socket completed (maybe none),
        as ``(opcode, payload)``; what came before and was not taken comes first.
        Pings are answered. A close frame (once the messages before it were taken)
        is answered and raises :class:`Closed`, as does the end of the connection.
        """
        if not self._pending:
            data = await self._read_some()
            if not data:
                await self._ended(ABNORMAL, "")
            self._pending.extend(self._reader.feed(data))
        messages: list[tuple[int, bytes]] = []
        pending = self._pending
        while pending:
            opcode, payload = pending[0]
            if opcode == OPCODE_CLOSE:
                if messages:
                    break  # these first; the close at the next call
                pending.clear()
                code, reason = _close_of(payload)
                if not self._close_sent:
                    self._close_sent = True
                    echo = close_payload(code) if code != NO_STATUS else b""
                    await self._reply(client_frame(echo, opcode=OPCODE_CLOSE))
                await self._ended(code, reason)
            pending.popleft()
            if opcode in _DATA:
                messages.append((opcode, payload))
            elif opcode == OPCODE_PING:
                await self._reply(client_frame(payload, opcode=OPCODE_PONG))
        return messages

    async def message(self) -> tuple[int, bytes]:
        """The next data message as ``(opcode, payload)`` (see :meth:`receive`)."""
        while True:
            messages = await self.receive()
            if messages:
                first, *rest = messages
                self._pending.extendleft(reversed(rest))
                return first

    async def op(self) -> Frame:
        """The next text message's JSON object."""
        while True:
            opcode, payload = await self.message()
            if opcode == OPCODE_TEXT:
                frame: Frame = json.loads(payload)
                return frame

    async def identify(self, token: str) -> int:
        """hello -> identify -> ``catchup.complete`` (pull mode); the hello's
        ``heartbeat_ms``."""
        hello = await self.op()
        await self.send("identify", {"token": token})
        while (await self.op()).get("op") != "catchup.complete":
            pass
        return int(hello["d"]["heartbeat_ms"])

    async def read_until(self, predicate: Callable[[Frame], bool]) -> Frame | None:
        """Read (pull mode), recording, until a message received from now on matches
        ``predicate`` (returned) or the connection ends (``None``; see
        :attr:`close_code`)."""
        try:
            while True:
                frame = await self.op()
                self.frames.append(frame)
                if predicate(frame):
                    return frame
        except Closed:
            return None

    async def wait_hello(self) -> Frame | None:
        """The ``hello`` (pull mode), or ``None`` when the server closed first."""
        return await self.read_until(lambda f: f.get("op") == "hello")

    async def _record(self) -> None:
        try:
            while True:
                self.frames.append(await self.op())
        except Closed:
            pass
        finally:
            self.ended = True
            await self.aclose()

    async def _ended(self, code: int, reason: str) -> NoReturn:
        if self.close_code is None:  # else this side closed first (close)
            self.close_code, self.close_reason = code, reason
        self.ended = True
        await self.aclose()
        raise Closed(code, reason)

    # -- waiting for recorded frames (recording mode) -----------------------------------

    async def wait_for(
        self, predicate: Callable[[Frame], bool], *, after: int = 0, timeout: float = 10.0
    ) -> Frame:
        """The first recorded message at index ``after`` or later that matches
        ``predicate``.

        Raises:
            AssertionError: the connection ended first.
            trio.TooSlowError: none within ``timeout`` seconds.
        """
        assert self._recording, "wait_for needs a recording client (connect)"
        with trio.fail_after(timeout):
            while True:
                for frame in self.frames[after:]:
                    if predicate(frame):
                        return frame
                if self.ended:
                    raise AssertionError(f"connection closed ({self.close_code}) while waiting")
                await trio.sleep(POLL)

    async def wait_op(self, op: str, *, after: int = 0, timeout: float = 10.0) -> Frame:
        return await self.wait_for(lambda f: f.get("op") == op, after=after, timeout=timeout)

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int | None, str | None]:
        """The server's close code and reason, once the connection ended."""
        with trio.fail_after(timeout):
            while not self.ended:
                await trio.sleep(POLL)
        return self.close_code, self.close_reason

    def notifications(self) -> list[Frame]:
        return [f for f in self.frames if f.get("type") == "notification.created"]

    async def focus(self, thread_ids: list[str], *, idle: bool = False) -> Frame:
        mark = len(self.frames)
        await self.send("focus", {"thread_ids": thread_ids, "idle": idle})
        return await self.wait_op("focus.ack", after=mark)

    async def read(self, thread_id: str, seq: int) -> Frame:
        mark = len(self.frames)
        await self.send("read", {"thread_id": thread_id, "seq": seq})
        return await self.wait_op("read.ack", after=mark)

    # -- sending ------------------------------------------------------------------------

    async def send_frame(self, frame: bytes) -> None:
        """Send encoded bytes as they are (:data:`PING`, or a hostile frame).

        Raises:
            Closed: the connection is gone.
        """
        async with self._sending:  # one frame at a time, never interleaved
            try:
                await self.stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise Closed(self.close_code or ABNORMAL, self.close_reason or "") from None

    async def _reply(self, frame: bytes) -> None:
        """A pong or the answer to the server's close, from the reading task: sent
        at once, or left out while another task is in the middle of a frame (the
        reader never waits behind a stalled sender)."""
        try:
            self._sending.acquire_nowait()
        except trio.WouldBlock:
            return
        try:
            await self.stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._sending.release()

    async def send(self, op: str, d: Any = None) -> None:
        """Send a gateway op: ``{"op": OP, "d": D}`` (``d`` left out when ``None``)."""
        await self.send_frame(op_frame(op, d))

    async def send_json(self, frame: Mapping[str, Any]) -> None:
        """Send any JSON object as one text message."""
        await self.send_frame(client_frame(json.dumps(frame).encode()))

    async def send_raw(self, message: str | bytes) -> None:
        """Send a text message (``str``) or a binary one (``bytes``) as it is."""
        if isinstance(message, str):
            await self.send_frame(client_frame(message.encode()))
        else:
            await self.send_frame(client_frame(message, opcode=OPCODE_BINARY))

    async def send_text_bytes(self, payload: bytes) -> None:
        """One text frame of ``payload`` as it is, UTF-8 or not (a hostile client)."""
        await self.send_frame(client_frame(payload))

    async def _send_close(self, code: int | None) -> None:
        self._close_sent = True
        payload = close_payload(code) if code is not None else b""
        with contextlib.suppress(Closed):
            await self.send_frame(client_frame(payload, opcode=OPCODE_CLOSE))

    # -- closing ------------------------------------------------------------------------

    async def close(self, code: int = 1000) -> None:
        """Close from this side: a close frame with ``code`` (sent within
        :data:`CLOSE_WAIT`), then the socket, without waiting for the server's
        answer (the server may hold it back: a 4029). :attr:`close_code` is
        ``code`` from then on."""
        if not self.ended:
            self.close_code, self.close_reason = code, ""
            if not self._close_sent:
                with trio.move_on_after(CLOSE_WAIT):
                    await self._send_close(code)
        await self.aclose()

    async def aclose(self) -> None:
        """Close the socket now (no close frame)."""
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


__all__ = [
    "ABNORMAL",
    "OPCODE_BINARY",
    "OPCODE_CLOSE",
    "OPCODE_PING",
    "OPCODE_PONG",
    "OPCODE_TEXT",
    "PING",
    "Closed",
    "FrameReader",
    "GatewayClient",
    "HandshakeRefused",
    "ProtocolError",
    "client_frame",
    "op_frame",
]
