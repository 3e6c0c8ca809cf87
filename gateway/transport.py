"""Our WebSocket server over wsproto: the only module that imports a WebSocket library.

The hub and the sessions see a :class:`Transport` (receive one message, send
one text frame, close with a code) and :func:`serve_websockets`, which
accepts connections on a path and hands each one to a handler. Replacing the
WebSocket library means rewriting this module only.

wsproto is sans-IO: nothing here runs a task of its own. The connection's
task (the session) reads the socket when it waits for a message and feeds
wsproto, answering pings and the peer's close frame as they come; sends go
straight to the socket. The upgrade's state (h11's parser, the request) is
dropped once the connection is accepted. An idle connection so holds its
session task, the socket, and a few small objects (``docs/performance.md``,
"gateway").

Three things are done in :class:`FramedStream`, the byte stream placed
between the TCP socket and wsproto:

- **Oversized client messages.** The gateway must close with 4003 when a
  message exceeds ``sync.max_frame_bytes``, without buffering it. The stream
  reads the client's frame headers as bytes pass through; the first frame
  that takes a message past the limit is swallowed whole (never buffered)
  together with the rest of that message, and the session is told, so it
  closes with 4003 while the close handshake still works.
- **Writes that are cut off.** A write bounded by ``sync.write_timeout`` may be
  cancelled halfway through a frame. The stream keeps the unsent bytes and
  sends them before anything else, so the framing survives and a later close
  frame (4014) still reaches a client that resumes reading. It also
  serializes writers (the session's pong or close, the connection's writer).
- **Invalid UTF-8.** wsproto would fail a text message that is not UTF-8
  (1007); the gateway must close with 4003. The stream hands text frames to
  wsproto as binary ones and remembers which messages were text; the
  transport decodes them itself, and a text message that is not UTF-8 comes
  out as bytes, which the protocol refuses as a malformed frame.

Connections that have not identified count against
``sync.max_unidentified_connections`` from the moment they are accepted
(:mod:`gateway.limits`): one evicted during the upgrade is dropped at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import trio
from wsproto.connection import ConnectionType
from wsproto.events import AcceptConnection, RejectConnection, Request
from wsproto.frame_protocol import FrameProtocol, Opcode, ParseFailed
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError

from bothy_notify.kernel.sockets import open_shared_listener
from gateway.errors import FrameTooLarge, TransportClosed
from gateway.limits import Pending, PendingConnections

log = logging.getLogger("bothy.gateway.transport")

_HTTP_END = b"\r\n\r\n"
"""Where the upgrade request ends and WebSocket frames begin."""

RECEIVE_BYTES = 4096
"""Bytes read from the socket at a time (as trio-websocket read): a client's ops are small."""

_OPEN, _CLOSING, _CLOSED = "open", "closing", "closed"
"""A transport's states: messages flow; our close frame is sent; nothing more."""

_OPCODE_TEXT = 0x1
_OPCODE_BINARY = 0x2


class Transport(Protocol):
    """One WebSocket connection as the gateway sees it."""

    async def receive(self) -> str | bytes:
        """The next client message.

        Raises:
            TransportClosed: the peer closed the connection or it broke.
            FrameTooLarge: a message exceeded ``sync.max_frame_bytes``.
        """
        ...

    async def send(self, text: str) -> None:
        """Send one text frame. Raises :class:`TransportClosed`. Cancellation keeps
        the framing intact (unsent bytes go out before anything else)."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame and end the connection; idempotent. Bound it with a
        cancel scope: on cancellation the TCP connection is closed at once."""
        ...

    def on_oversized(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when a client message exceeds ``sync.max_frame_bytes``;
        :meth:`receive` raises :class:`FrameTooLarge` from then on."""
        ...

    @property
    def oversized(self) -> bool:
        """Whether a client message exceeded ``sync.max_frame_bytes``."""
        ...

    def on_evicted(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (instead of dropping the connection) when the limit of
        unidentified connections evicts this one to make room for a newer one."""
        ...

    def identified(self) -> None:
        """The connection identified: it no longer counts as unidentified."""
        ...


class FramedStream(trio.abc.Stream):
    """The TCP stream under wsproto: guards message size, keeps cut-off writes.

    Args:
        stream: the accepted TCP stream.
        max_frame_bytes: ``sync.max_frame_bytes``.
    """

    __slots__ = (
        "_dropping",
        "_header",
        "_header_need",
        "_http_tail",
        "_in_http",
        "_limit",
        "_message_bytes",
        "_passing",
        "_payload_left",
        "_sending",
        "_sent",
        "_stream",
        "_text",
        "_unsent",
        "on_oversized",
        "oversized",
    )

    def __init__(self, stream: trio.SocketStream, max_frame_bytes: int) -> None:
        self._stream = stream
        self._limit = max_frame_bytes
        self._unsent = bytearray()
        self._in_http = True
        self._http_tail = b""
        self._header = bytearray()
        self._header_need = 2
        self._payload_left = 0
        self._passing = True
        self._message_bytes = 0
        self._dropping = False
        self._text: list[bool] | None = None  # per message passed on: was it text?
        self._sending = False  # a task is in send_all's loop
        self._sent: trio.Event | None = None  # set when that task leaves it
        self.oversized = False  # a client message went past the limit: close with 4003
        self.on_oversized: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"FramedStream(oversized={self.oversized})"

    # -- sending: never lose bytes of a frame that was started -------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` after any bytes a cancelled send left behind.

        Tasks may send at once (the session's pong or close, the writer's
        frames): the first one writes everything queued, the others wait for it
        and return once their bytes are out, or take over if it was cancelled.
        Cancelled while waiting, the bytes still go out, whole, before later ones.
        """
        self._unsent += data
        while self._unsent:
            if self._sending:
                if self._sent is None:
                    self._sent = trio.Event()
                await self._sent.wait()
                continue
            self._sending = True
            try:
                sock = self._stream.socket
                while self._unsent:
                    sent = await sock.send(self._unsent)
                    del self._unsent[:sent]
            except OSError as exc:
                raise trio.BrokenResourceError("the connection broke") from exc
            finally:
                self._sending = False
                if self._sent is not None:
                    self._sent.set()
                    self._sent = None

    async def wait_send_all_might_not_block(self) -> None:
        """As the TCP stream's."""
        await self._stream.wait_send_all_might_not_block()

    # -- receiving: watch message sizes ---------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Bytes for wsproto, without the frames of an oversized message."""
        while True:
            data = await self._stream.receive_some(max_bytes)
            if not data:
                return b""
            passed = self._filter(data)
            if passed:
                return passed

    async def aclose(self) -> None:
        """Close the TCP connection (idempotent); unsent bytes are dropped."""
        await self._stream.aclose()

    def was_text(self) -> bool:
        """Whether the next message passed on was sent as text (each message
        passed on is asked about once, in order)."""
        text = self._text
        if not text:
            return False
        was = text.pop(0)
        if not text:
            self._text = None  # an idle connection keeps no list
        return was

    def _filter(self, data: bytes) -> bytes:
        if self._in_http:
            joined = self._http_tail + data
            end = joined.find(_HTTP_END)
            if end < 0:
                self._http_tail = joined[-3:]
                return data
            cut = end + len(_HTTP_END) - len(self._http_tail)
            self._in_http = False
            self._http_tail = b""
            return data[:cut] + self._frames(memoryview(data)[cut:])
        return self._frames(memoryview(data))

    def _frames(self, view: memoryview) -> bytes:
        out = bytearray()
        i, n = 0, len(view)
        while i < n:
            if self._payload_left:
                take = min(self._payload_left, n - i)
                if self._passing:
                    out += view[i : i + take]
                i += take
                self._payload_left -= take
                continue
            take = min(self._header_need - len(self._header), n - i)
            self._header += view[i : i + take]
            i += take
            if len(self._header) < self._header_need:
                continue
            if self._header_need == 2:
                need = (
                    2
                    + _extended_length_bytes(self._header[1])
                    + (4 if self._header[1] & 0x80 else 0)
                )
                if need > 2:
                    self._header_need = need
                    continue
            self._start_frame(out)
        return bytes(out)

    def _start_frame(self, out: bytearray) -> None:
        header = self._header
        fin, opcode = bool(header[0] & 0x80), header[0] & 0x0F
        extra = _extended_length_bytes(header[1])
        length = int.from_bytes(header[2 : 2 + extra], "big") if extra else header[1] & 0x7F
        passing = True
        if not opcode & 0x08:  # a data frame (control frames are small and always pass)
            if opcode != 0:
                self._message_bytes, self._dropping = 0, False
            self._message_bytes += length
            if self._dropping or self._message_bytes > self._limit:
                passing, self._dropping = False, not fin
                if not self.oversized:
                    self.oversized = True
                    if self.on_oversized is not None:
                        self.on_oversized()
            elif opcode != 0:  # the first frame of a message that is passed on
                if self._text is None:
                    self._text = []
                self._text.append(opcode == _OPCODE_TEXT)
                if opcode == _OPCODE_TEXT:  # wsproto must not judge its UTF-8
                    header[0] = (header[0] & 0xF0) | _OPCODE_BINARY
            if fin:
                self._message_bytes = 0
        if passing:
            out += header
        self._passing = passing
        self._payload_left = length
        self._header = bytearray()
        self._header_need = 2


def _extended_length_bytes(second: int) -> int:
    length7 = second & 0x7F
    return 2 if length7 == 126 else 8 if length7 == 127 else 0


class WebSocketTransport:
    """A :class:`Transport` over one accepted connection, driven through wsproto.

    No task of its own: the session's task reads the socket in :meth:`receive`
    (answering pings and the peer's close there), and whoever sends writes
    through :meth:`FramedStream.send_all`, which serializes writers.

    Args:
        frames: the connection's wsproto frame protocol, after the upgrade.
        stream: the connection's :class:`FramedStream`.
        pending: its place among the unidentified connections.
    """

    __slots__ = ("_frames", "_parts", "_peer_code", "_pending", "_state", "_stream")

    def __init__(self, frames: FrameProtocol, stream: FramedStream, pending: Pending) -> None:
        self._frames = frames
        self._stream = stream
        self._pending = pending
        self._state = _OPEN
        self._peer_code: int | None = None  # the code of the peer's close frame
        self._parts: list[bytes] | None = None  # fragments of a message being received

    def __repr__(self) -> str:
        return f"WebSocketTransport(state={self._state})"

    def on_oversized(self, callback: Callable[[], None]) -> None:
        self._stream.on_oversized = callback

    @property
    def oversized(self) -> bool:
        return self._stream.oversized

    def on_evicted(self, callback: Callable[[], None]) -> None:
        self._pending.on_evicted(callback)

    def identified(self) -> None:
        self._pending.leave()

    async def receive(self) -> str | bytes:
        while True:
            if self._stream.oversized:
                raise FrameTooLarge()
            if self._state != _OPEN:
                raise TransportClosed(self._peer_code)
            message = await self._next_buffered()
            if message is not None:
                return message
            if self._state != _OPEN:  # the peer's close frame, answered
                raise TransportClosed(self._peer_code)
            try:
                data = await self._stream.receive_some(RECEIVE_BYTES)
            except _ENDED:
                data = b""
            if not data:  # the connection ended without a close frame
                self._state = _CLOSED
                if self._stream.oversized:
                    raise FrameTooLarge()
                raise TransportClosed(None)
            self._frames.receive_bytes(data)

    async def _next_buffered(self) -> str | bytes | None:
        """The next whole message among the bytes received so far, or ``None``;
        answers pings and the peer's close frame on the way."""
        try:
            for frame in self._frames.received_frames():
                opcode = frame.opcode
                if opcode is Opcode.PING:
                    assert isinstance(frame.payload, bytes | bytearray)
                    await self._send_frame(self._frames.pong(frame.payload))
                elif opcode is Opcode.CLOSE:
                    assert isinstance(frame.payload, tuple)
                    code, reason = frame.payload
                    self._peer_code = int(code)
                    with contextlib.suppress(TransportClosed):
                        await self._send_frame(self._frames.close(code, reason))
                    self._state = _CLOSED
                    return None
                elif opcode is not Opcode.PONG:  # a data frame
                    message = self._message(frame.payload, frame.message_finished)
                    if message is not None:
                        return message
        except ParseFailed as exc:  # as trio-websocket did: ended, no close frame
            self._state, self._peer_code = _CLOSED, int(exc.code)
        return None

    def _message(self, payload: object, finished: bool) -> str | bytes | None:
        # Text frames reach wsproto as binary ones (FramedStream): payloads are bytes.
        assert isinstance(payload, bytes | bytearray)
        if not finished:
            if self._parts is None:
                self._parts = []
            self._parts.append(bytes(payload))
            return None
        if self._parts is None:
            message = bytes(payload)
        else:
            self._parts.append(bytes(payload))
            message, self._parts = b"".join(self._parts), None
        if self._stream.was_text():
            try:
                return message.decode("utf-8")
            except UnicodeDecodeError:
                return message  # not text after all: a malformed frame
        return message

    async def send(self, text: str) -> None:
        if self._state != _OPEN:
            raise TransportClosed(self._peer_code)
        await self._send_frame(self._frames.send_data(text))

    async def _send_frame(self, data: bytearray) -> None:
        try:
            await self._stream.send_all(data)
        except _ENDED:
            self._state = _CLOSED
            raise TransportClosed(self._peer_code) from None

    async def close(self, code: int, reason: str) -> None:
        if self._state != _OPEN:
            return
        self._state = _CLOSING
        try:
            await self._send_frame(self._frames.close(code, reason))
            await self._wait_peer_close()
        except TransportClosed:
            pass
        finally:
            self._state = _CLOSED

    async def _wait_peer_close(self) -> None:
        """Read (and drop) until the peer's close frame or the end of the
        connection: closing the socket with unread bytes would reset it, and the
        client could lose the close frame."""
        while True:
            try:
                for frame in self._frames.received_frames():
                    if frame.opcode is Opcode.CLOSE:
                        return
            except ParseFailed:
                return
            try:
                data = await self._stream.receive_some(RECEIVE_BYTES)
            except _ENDED:
                return
            if not data:
                return
            self._frames.receive_bytes(data)


def split_listen(address: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_listen(host: str, port: int) -> str:
    """The inverse of :func:`split_listen`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


Handler = Callable[[Transport, trio.Nursery], Awaitable[None]]
"""Runs one connection: its transport, and a nursery for the connection's own tasks
(cancelled once the handler returned and the connection is closed)."""


async def serve_websockets(
    listen: str,
    handler: Handler,
    *,
    path: str,
    max_frame_bytes: int,
    handshake_timeout: float,
    pending: PendingConnections,
    on_dropped: Callable[[], None] = lambda: None,
    reuse_port: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept WebSocket connections on ``listen`` and run ``handler`` for each.

    Args:
        listen: ``host:port``; port 0 picks a free port.
        handler: runs one connection (see :data:`Handler`); the connection is
            closed when it returns.
        path: the only path served (others are refused with HTTP 404).
        max_frame_bytes: the largest client message (larger ones raise
            :class:`FrameTooLarge` from :meth:`Transport.receive`).
        handshake_timeout: seconds the HTTP upgrade may take.
        pending: the limit of unidentified connections; each accepted
            connection counts until the handler calls
            :meth:`Transport.identified` (or the connection ends).
        on_dropped: called for each connection the limit evicts during the
            upgrade (it is dropped without a close frame).
        reuse_port: bind with ``SO_REUSEPORT``: one of the node processes of
            ``server.processes`` sharing the port
            (:mod:`bothy_notify.kernel.sockets`).

    ``task_status.started`` receives the bound ``host:port`` once the socket
    listens. Cancellation stops accepting and cancels every connection.
    """
    host, port = split_listen(listen)
    listeners: list[trio.SocketListener]
    if reuse_port:
        listeners = [open_shared_listener(listen)]
    else:
        listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    serve_one = partial(
        _serve_one,
        handler=handler,
        path=path,
        max_frame_bytes=max_frame_bytes,
        handshake_timeout=handshake_timeout,
        pending=pending,
        on_dropped=on_dropped,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve_one, listeners)
        task_status.started(join_listen(host, bound))


async def _serve_one(
    stream: trio.SocketStream,
    *,
    handler: Handler,
    path: str,
    max_frame_bytes: int,
    handshake_timeout: float,
    pending: PendingConnections,
    on_dropped: Callable[[], None],
) -> None:
    framed = FramedStream(stream, max_frame_bytes)
    try:
        async with trio.open_nursery() as nursery:

            def drop() -> None:  # evicted during the upgrade (the handler takes over after it)
                on_dropped()
                nursery.cancel_scope.cancel()

            entry = pending.enter(drop)
            try:
                frames: FrameProtocol | None = None
                with trio.move_on_after(handshake_timeout):
                    frames = await _handshake(framed, path)
                if frames is not None:
                    await handler(WebSocketTransport(frames, framed, entry), nursery)
            except _ENDED:
                pass
            finally:
                entry.leave()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # one broken connection must never stop the listener
        log.warning("gateway connection failed", extra={"error_type": type(exc).__name__})
    finally:
        with trio.CancelScope(shield=True):
            await framed.aclose()


_ENDED = (trio.BrokenResourceError, trio.ClosedResourceError)
"""The connection ended below the protocol; nothing is left to do but close the socket."""


async def _handshake(framed: FramedStream, path: str) -> FrameProtocol | None:
    """The HTTP upgrade: the frame protocol of the accepted connection, or ``None``
    when the request is refused (a path not served: 404; not a WebSocket
    upgrade: 400 or 426) or the peer went away. The handshake's state (h11's
    parser, the request) is dropped once it is over."""
    handshake = H11Handshake(ConnectionType.SERVER)
    while True:
        data = await framed.receive_some(RECEIVE_BYTES)
        if not data:
            return None
        try:
            handshake.receive_data(data)
        except RemoteProtocolError as exc:
            if exc.event_hint is not None:
                await framed.send_all(handshake.send(exc.event_hint))
            return None
        for event in handshake.events():
            if not isinstance(event, Request):
                continue
            if event.target.partition("?")[0] != path:
                await framed.send_all(handshake.send(RejectConnection(status_code=404)))
                return None
            await framed.send_all(handshake.send(AcceptConnection()))
            return FrameProtocol(client=False, extensions=[])
