"""Our adapter over trio-websocket: the only module that imports the library.

The hub and the sessions see a :class:`Transport` (receive one message, send
one text frame, close with a code) and :func:`serve_websockets`, which
accepts connections on a path and hands each one to a handler. Replacing the
WebSocket library means rewriting this module only.

Two things the library does not do are done here, in :class:`FramedStream`,
the byte stream placed between the TCP socket and the library:

- **Oversized client messages.** trio-websocket closes with 1009 when a
  message exceeds its limit; the gateway must close with 4003. The stream
  reads the client's frame headers as bytes pass through; the first frame
  that takes a message past ``sync.max_frame_bytes`` is swallowed whole (never
  buffered) together with the rest of that message, and the session is told,
  so it closes with 4003 while the close handshake still works.
- **Writes that are cut off.** A write bounded by ``sync.write_timeout`` may be
  cancelled halfway through a frame. The stream keeps the unsent bytes and
  sends them before anything else, so the framing survives and a later close
  frame (4014) still reaches a client that resumes reading.
- **Invalid UTF-8.** The library closes with 1007 when a text message is not
  UTF-8; the gateway must close with 4003. The stream hands text frames to the
  library as binary ones and remembers which messages were text; the
  transport decodes them itself, and a text message that is not UTF-8 comes
  out as bytes, which the protocol refuses as a malformed frame.

Connections that have not identified count against
``sync.max_unidentified_connections`` from the moment they are accepted
(:mod:`gateway.limits`): one evicted during the upgrade is dropped at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import trio
import trio_websocket

from bothy_notify.kernel.sockets import open_shared_listener
from gateway.errors import FrameTooLarge, TransportClosed
from gateway.limits import Pending, PendingConnections

log = logging.getLogger("bothy.gateway.transport")

_HTTP_END = b"\r\n\r\n"
"""Where the upgrade request ends and WebSocket frames begin."""

LIBRARY_QUEUE = 1
"""Messages the library buffers ahead of the session; one keeps TCP backpressure."""

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
    """The TCP stream under the library: guards message size, keeps cut-off writes.

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
        self._text: deque[bool] | None = None  # per message passed on: was it text?
        self.oversized = False  # a client message went past the limit: close with 4003
        self.on_oversized: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"FramedStream(oversized={self.oversized})"

    # -- sending: never lose bytes of a frame that was started -------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` after any bytes a cancelled send left behind."""
        self._unsent += data
        sock = self._stream.socket
        try:
            while self._unsent:
                sent = await sock.send(self._unsent)
                del self._unsent[:sent]
        except OSError as exc:
            raise trio.BrokenResourceError("the connection broke") from exc

    async def wait_send_all_might_not_block(self) -> None:
        """As the TCP stream's."""
        await self._stream.wait_send_all_might_not_block()

    # -- receiving: watch message sizes ---------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Bytes for the library, without the frames of an oversized message."""
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
        """Whether the next message the library delivers was sent as text (each
        message passed on is asked about once, in order)."""
        text = self._text
        return text.popleft() if text else False

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
                    self._text = deque()
                self._text.append(opcode == _OPCODE_TEXT)
                if opcode == _OPCODE_TEXT:  # the library must not judge its UTF-8
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
    """A :class:`Transport` over one trio-websocket server connection."""

    __slots__ = ("_pending", "_stream", "_ws")

    def __init__(
        self, ws: trio_websocket.WebSocketConnection, stream: FramedStream, pending: Pending
    ) -> None:
        self._ws = ws
        self._stream = stream
        self._pending = pending

    def __repr__(self) -> str:
        return "WebSocketTransport()"

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
        if self._stream.oversized:
            raise FrameTooLarge()
        try:
            message = await self._ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            if self._stream.oversized:
                raise FrameTooLarge() from None
            raise TransportClosed(_peer_code(exc)) from None
        if isinstance(message, bytes) and self._stream.was_text():
            try:
                return message.decode("utf-8")
            except UnicodeDecodeError:
                return message  # not text after all: a malformed frame
        return message

    async def send(self, text: str) -> None:
        try:
            await self._ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_peer_code(exc)) from None

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._ws.aclose(code, reason)


def _peer_code(exc: trio_websocket.ConnectionClosed) -> int | None:
    return exc.reason.code if exc.reason is not None else None


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
        async with trio.open_nursery() as library:

            def drop() -> None:  # evicted during the upgrade (the handler takes over after it)
                on_dropped()
                library.cancel_scope.cancel()

            entry = pending.enter(drop)
            try:
                ws: trio_websocket.WebSocketConnection | None = None
                with trio.move_on_after(handshake_timeout):
                    ws = await _handshake(library, framed, path, max_frame_bytes)
                if ws is not None:
                    await handler(WebSocketTransport(ws, framed, entry), library)
            except _ENDED:
                pass
            finally:
                entry.leave()
                library.cancel_scope.cancel()
    except Exception as exc:  # one broken connection must never stop the listener
        log.warning("gateway connection failed", extra={"error_type": type(exc).__name__})
    finally:
        with trio.CancelScope(shield=True):
            await framed.aclose()


_ENDED = (
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)
"""The connection ended below the protocol; nothing is left to do but close the socket."""


async def _handshake(
    library: trio.Nursery,
    framed: FramedStream,
    path: str,
    max_frame_bytes: int,
) -> trio_websocket.WebSocketConnection | None:
    """The HTTP upgrade; ``None`` when the path is not served (answered with 404)."""
    request = await trio_websocket.wrap_server_stream(
        library, framed, message_queue_size=LIBRARY_QUEUE, max_message_size=max_frame_bytes
    )
    if request.path.partition("?")[0] != path:
        await request.reject(404)
        return None
    return await request.accept()
