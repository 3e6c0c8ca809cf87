"""Our WebSocket server: the listener, the HTTP upgrade, and each connection's socket.

The hub and the sessions see a :class:`Transport` (receive one message, send
one text frame, close with a code) and :func:`serve_websockets`, which
accepts connections on a path and hands each one to a handler.

Three parts, none with a task of its own:

- **The upgrade** runs on wsproto's ``H11Handshake`` (the only use of a
  WebSocket library), and its state is dropped once the connection is
  accepted; bytes after the request are frames.
- **Reading.** The connection's task (the session) reads the socket when it
  waits for a message and feeds the bytes to the connection's
  :class:`~gateway.frames.FrameFilter`, the sans-IO part that knows RFC 6455,
  ``sync.max_frame_bytes`` and the connection's token bucket
  (``sync.ops_per_second``, ``sync.ops_burst``). It answers WebSocket pings
  and the peer's close frame as they come. A message past the size limit
  raises :class:`FrameTooLarge` (1009), frames past the bucket
  :class:`TooManyFrames` (4029), bytes that break the framing or text that
  is not UTF-8 :class:`FramingError` (1002, 1007). The session closes with
  that code; after a :class:`FramingError` nothing more is read (RFC 6455
  section 7.1.7): the close frame goes out, then the end of our side of the
  TCP connection, and whatever the client still sends is dropped until it
  closes its side.
- **Writing** goes through :class:`WriteStream`. It serialises writers (the
  session's replies, the connection's writer, pongs, the close frame), keeps
  the unsent rest of a write that a timeout cut off, so the framing survives
  and a later close frame (4014) still reaches a client that resumes
  reading, and first tries the socket at once (:meth:`WriteStream.send_nowait`):
  a reply that fits in the socket's buffer is written without a task,
  a timer or a wait.

The sockets are the standard library's, in non-blocking mode, waited on with
``trio.lowlevel.wait_readable``/``wait_writable``: a ping costs one wake-up of
the session's task, one ``recv`` and one ``send``. A read that found bytes
without waiting yields to the other tasks before the bytes are served, so a
client that floods cannot hold the event loop.

Connections that have not identified count against
``sync.max_unidentified_connections`` from the moment they are accepted
(:mod:`gateway.limits`): one evicted during the upgrade is dropped at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import trio
from wsproto.connection import ConnectionType
from wsproto.events import RejectConnection, Request
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError, generate_accept_token, normed_header_dict

from bothy_notify.kernel.sockets import bind_shared, join_address, split_address
from gateway.errors import (
    FrameTooLarge,
    FramingError,
    TooManyFrames,
    TransportClosed,
    TransportError,
)
from gateway.frames import (
    TOO_LARGE,
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
from gateway.limits import Pending, PendingConnections

log = logging.getLogger("bothy.gateway.transport")

_HTTP_END = b"\r\n\r\n"
"""Where the upgrade request ends and WebSocket frames begin."""

_SWITCHING = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: %s\r\n\r\n"
)
"""The answer to an accepted upgrade (as wsproto writes it), with the accept token."""

RECEIVE_BYTES = 4096
"""Bytes read from the socket at a time: a client's ops are small."""

UNSENT_LOW_WATER = 2**14
"""``TCP_NOTSENT_LOWAT`` of every connection, as Trio sets it (16 KiB)."""

BACKLOG = 65_535
"""The listen backlog asked for (the kernel caps it at ``net.core.somaxconn``)."""

_OPEN, _CLOSING, _CLOSED = "open", "closing", "closed"
"""A transport's states: messages flow; our close frame is sent; nothing more."""

_RESOURCE_ERRORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS))
"""``accept`` failures that say this process is short of something: wait before the next."""


class Transport(Protocol):
    """One WebSocket connection as the gateway sees it."""

    async def receive(self) -> str | bytes:
        """The next client message.

        Raises:
            TransportClosed: the peer closed the connection or it broke.
            FrameTooLarge: a message exceeded ``sync.max_frame_bytes``.
            TooManyFrames: the client sent frames faster than its bucket allows.
            FramingError: the client's bytes broke RFC 6455, or its text was not UTF-8.
        """
        ...

    async def send(self, text: str) -> None:
        """Send one text frame. Raises :class:`TransportClosed`. Cancellation keeps
        the framing intact (unsent bytes go out before anything else)."""
        ...

    def send_nowait(self, *texts: str) -> bool:
        """Send text frames, one each, in one write if the socket takes all of it at
        once. ``False``: what it did not take is kept, and :meth:`flush` must send
        it. Raises :class:`TransportClosed`."""
        ...

    async def flush(self) -> None:
        """Send whatever earlier sends kept. Raises :class:`TransportClosed`."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Send a close frame and end the connection; idempotent. Bound it with a
        cancel scope: on cancellation the TCP connection is closed at once."""
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


async def _wait_recv(sock: socket.socket) -> tuple[bytes, bool]:
    """The next bytes of ``sock`` (``b""``: the connection ended) and whether it
    had to wait for them."""
    try:
        return sock.recv(RECEIVE_BYTES), False
    except BlockingIOError:
        pass
    except OSError:
        return b"", False
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return sock.recv(RECEIVE_BYTES), True
        except BlockingIOError:
            continue
        except OSError:
            return b"", True


class WriteStream:
    """The writing side of one connection's socket (see the module docstring).

    Args:
        sock: the accepted socket, non-blocking.
    """

    __slots__ = ("_sending", "_sent", "_sock", "_unsent")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._unsent = bytearray()
        self._sending = False  # a task is in flush's loop
        self._sent: trio.Event | None = None  # set when that task leaves it

    def __repr__(self) -> str:
        return f"WriteStream(unsent={len(self._unsent)})"

    @property
    def unsent(self) -> int:
        """Bytes kept for the next :meth:`flush`."""
        return len(self._unsent)

    def send_nowait(self, data: bytes) -> bool:
        """Send ``data`` now, after what earlier writes left, unless another task is
        flushing; whatever the socket does not take is kept for :meth:`flush`, and
        the answer is whether nothing is kept.

        Raises:
            trio.BrokenResourceError: the connection broke.
        """
        if self._sending:
            self._unsent += data
            return False
        kept = self._unsent
        if kept:  # what an earlier write left goes first, in the same write
            kept += data
        try:
            sent = self._sock.send(kept or data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError("the connection broke") from exc
        if kept:
            del kept[:sent]
            return not kept
        if sent == len(data):
            return True
        kept += memoryview(data)[sent:]
        return False

    async def send_all(self, data: bytes) -> None:
        """Send ``data`` after any bytes a cancelled send left behind."""
        if not self.send_nowait(data):
            await self.flush()

    async def flush(self) -> None:
        """Send every byte kept.

        Tasks may flush at once (the session's pong or close, the writer's
        frames): the first one writes everything kept, the others wait for it
        and return once their bytes are out, or take over if it was cancelled.
        Cancelled while waiting, the bytes still go out, whole, before later ones.

        Raises:
            trio.BrokenResourceError: the connection broke.
        """
        sock = self._sock
        while self._unsent:
            if self._sending:
                if self._sent is None:
                    self._sent = trio.Event()
                await self._sent.wait()
                continue
            self._sending = True
            try:
                while self._unsent:
                    try:
                        sent = sock.send(self._unsent)
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(sock)
                        continue
                    del self._unsent[:sent]
            except OSError as exc:
                raise trio.BrokenResourceError("the connection broke") from exc
            finally:
                self._sending = False
                if self._sent is not None:
                    self._sent.set()
                    self._sent = None


class WebSocketTransport:
    """A :class:`Transport` over one accepted connection.

    No task of its own: the session's task reads the socket in :meth:`receive`
    (answering pings and the peer's close there), and whoever sends writes
    through the connection's :class:`WriteStream`, which serialises writers.

    Args:
        sock: the accepted socket, non-blocking.
        frames: the connection's frame filter.
        writes: the connection's write stream.
        pending: its place among the unidentified connections.
        greeting: the upgrade's answer (101), not sent yet: it goes out with the
            first frame (one write for both), or before the first read.
    """

    __slots__ = (
        "_end",
        "_events",
        "_frames",
        "_greeting",
        "_peer_code",
        "_pending",
        "_sock",
        "_state",
        "_writes",
    )

    def __init__(
        self,
        sock: socket.socket,
        frames: FrameFilter,
        writes: WriteStream,
        pending: Pending,
        greeting: bytes = b"",
    ) -> None:
        self._sock = sock
        self._frames = frames
        self._writes = writes
        self._pending = pending
        self._greeting = greeting  # the upgrade's answer, sent with the first frame
        self._state = _OPEN
        self._peer_code: int | None = None  # the code of the peer's close frame
        self._events: list[Inbound] | None = None  # filtered, not yet served
        self._end: Inbound | None = None  # TOO_LARGE, TOO_MANY or Broken, once served

    def __repr__(self) -> str:
        return f"WebSocketTransport(state={self._state})"

    @property
    def oversized(self) -> bool:
        return self._frames.oversized

    def on_evicted(self, callback: Callable[[], None]) -> None:
        self._pending.on_evicted(callback)

    def identified(self) -> None:
        self._pending.leave()

    def received(self, data: bytes) -> None:
        """Bytes that came with the upgrade request (frames sent before its answer)."""
        self._events = self._frames.feed(data, trio.current_time()) or None

    async def receive(self) -> str | bytes:
        while True:
            if self._end is not None:
                raise _ended_by(self._end)
            if self._state != _OPEN:
                raise TransportClosed(self._peer_code)
            events = self._events
            while events:  # in order: what came before an end is served first
                event = events.pop(0)
                if type(event) is Message:
                    if not events:
                        self._events = None
                    return event.data
                await self._control(event)
                if self._state != _OPEN or self._end is not None:
                    break
            else:
                self._events = None
                if self._greeting:
                    await self._send(b"")
                data, waited = await _wait_recv(self._sock)
                if not data:  # the connection ended without a close frame
                    self._state = _CLOSED
                    raise TransportClosed(None)
                self._events = self._frames.feed(data, trio.current_time()) or None
                if not waited:  # bytes were waiting: let the other tasks run first
                    await trio.lowlevel.checkpoint()

    async def _control(self, event: Inbound) -> None:
        """Serve what is not a message: a ping, the peer's close, or one of the ends
        (kept: :meth:`receive` raises it from now on; what follows it stays for
        :meth:`_wait_peer_close`)."""
        if type(event) is PingFrame:
            await self._send(pong_frame(event.payload))
        elif type(event) is CloseFrame:
            self._peer_code = event.code
            with contextlib.suppress(TransportClosed):
                await self._send(close_frame(event.code, event.reason))
                # The handshake is over: our end of the TCP connection follows the close
                # frame at once, as RFC 6455 section 7.1.1 asks of a server.
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_WR)
            self._state = _CLOSED
        else:
            self._end = event

    async def send(self, text: str) -> None:
        if self._state != _OPEN:
            raise TransportClosed(self._peer_code)
        await self._send(text_frame(text))

    def send_nowait(self, *texts: str) -> bool:
        if self._state != _OPEN:
            raise TransportClosed(self._peer_code)
        data = text_frame(texts[0]) if len(texts) == 1 else b"".join(map(text_frame, texts))
        if self._greeting:
            data, self._greeting = self._greeting + data, b""
        try:
            return self._writes.send_nowait(data)
        except _ENDED:
            self._state = _CLOSED
            raise TransportClosed(self._peer_code) from None

    async def flush(self) -> None:
        try:
            await self._writes.flush()
        except _ENDED:
            self._state = _CLOSED
            raise TransportClosed(self._peer_code) from None

    async def _send(self, data: bytes) -> None:
        if self._greeting:
            data, self._greeting = self._greeting + data, b""
        try:
            await self._writes.send_all(data)
        except _ENDED:
            self._state = _CLOSED
            raise TransportClosed(self._peer_code) from None

    async def close(self, code: int, reason: str) -> None:
        if self._state != _OPEN:
            return
        self._state = _CLOSING
        try:
            await self._send(close_frame(code, reason))
            if type(self._end) is Broken:  # no close frame of the peer can be read: end our side
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_WR)
            await self._wait_peer_close()
        except TransportClosed:
            pass
        finally:
            self._state = _CLOSED

    async def _wait_peer_close(self) -> None:
        """Read (and drop) until the peer's close frame or the end of the
        connection: closing the socket with unread bytes would reset it, and the
        client could lose the close frame. Once the framing broke only the end
        of the connection counts."""
        while True:
            events, self._events = self._events, None
            if events and any(type(e) is CloseFrame or type(e) is Broken for e in events):
                return
            data, _ = await _wait_recv(self._sock)
            if not data:
                return
            self._events = self._frames.feed(data, trio.current_time()) or None


def _ended_by(end: Inbound) -> TransportError:
    """The error :meth:`WebSocketTransport.receive` raises after ``end``."""
    if type(end) is Broken:
        return FramingError(end.code)
    return FrameTooLarge() if end is TOO_LARGE else TooManyFrames()


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
    ops_per_second: float | None = None,
    ops_burst: int = 1,
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
        ops_per_second, ops_burst: each connection's token bucket of frames
            (``None``: unlimited); past it :meth:`Transport.receive` raises
            :class:`TooManyFrames`.
        on_dropped: called for each connection the limit evicts during the
            upgrade (it is dropped without a close frame).
        reuse_port: bind with ``SO_REUSEPORT``: one of the node processes of
            ``server.processes`` sharing the port
            (:mod:`bothy_notify.kernel.sockets`).

    ``task_status.started`` receives the bound ``host:port`` once the socket
    listens. Cancellation stops accepting and cancels every connection.
    """
    host, port = split_address(listen)
    if reuse_port:
        sockets = [bind_shared(listen)]
    else:
        sockets = [
            socket.socket(fileno=listener.socket.detach())
            for listener in await trio.open_tcp_listeners(port, host=host)
        ]
    try:
        for sock in sockets:
            if reuse_port:
                sock.listen(BACKLOG)
            sock.setblocking(False)
        serve_one = partial(
            _serve_one,
            handler=handler,
            path=path,
            max_frame_bytes=max_frame_bytes,
            bucket=(
                partial(TokenBucket, ops_per_second, ops_burst)
                if ops_per_second is not None
                else None
            ),
            handshake_timeout=handshake_timeout,
            pending=pending,
            on_dropped=on_dropped,
        )
        async with trio.open_nursery() as nursery:
            for sock in sockets:
                nursery.start_soon(_accept, sock, nursery, serve_one)
            task_status.started(join_address(host, sockets[0].getsockname()[1]))
    finally:
        for sock in sockets:
            trio.lowlevel.notify_closing(sock)
            sock.close()


async def _accept(
    listener: socket.socket,
    nursery: trio.Nursery,
    serve_one: Callable[[socket.socket], Awaitable[None]],
) -> None:
    """Accept connections until cancelled: one, then the other tasks run (so a flood
    of connections is taken in at the pace of the sessions it competes with, and
    a client between ``hello`` and ``identify`` is not outrun by it)."""
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(listener)
            continue
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRORS:
                log.error(
                    "the gateway cannot accept a connection",
                    extra={"error_type": errno.errorcode.get(exc.errno or 0, "OSError")},
                )
                await trio.sleep(0.1)
            continue  # otherwise that client went away before it was accepted
        _configure(sock)
        nursery.start_soon(serve_one, sock)
        await trio.lowlevel.checkpoint()


def _configure(sock: socket.socket) -> None:
    """An accepted socket as Trio's ``SocketStream`` sets one up: non-blocking, no
    Nagle delay, and at most :data:`UNSENT_LOW_WATER` bytes unsent in the kernel (so
    a frame counts as written when it is close to the client, and a client that
    stops reading holds little kernel memory)."""
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_NOTSENT_LOWAT"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LOW_WATER)


async def _serve_one(
    sock: socket.socket,
    *,
    handler: Handler,
    path: str,
    max_frame_bytes: int,
    bucket: Callable[[], TokenBucket] | None,
    handshake_timeout: float,
    pending: PendingConnections,
    on_dropped: Callable[[], None],
) -> None:
    writes = WriteStream(sock)
    try:
        async with trio.open_nursery() as nursery:

            def drop() -> None:  # evicted during the upgrade (the handler takes over after it)
                on_dropped()
                nursery.cancel_scope.cancel()

            entry = pending.enter(drop)
            try:
                upgraded: tuple[bytes, bytes] | None = None
                with trio.move_on_after(handshake_timeout):
                    upgraded = await _handshake(sock, writes, path)
                if upgraded is not None:
                    greeting, after = upgraded
                    frames = FrameFilter(max_frame_bytes, bucket() if bucket else None)
                    transport = WebSocketTransport(sock, frames, writes, entry, greeting)
                    if after:
                        transport.received(after)
                    await handler(transport, nursery)
            except _ENDED:
                pass
            finally:
                entry.leave()
                nursery.cancel_scope.cancel()
    except Exception as exc:  # one broken connection must never stop the listener
        log.warning("gateway connection failed", extra={"error_type": type(exc).__name__})
    finally:
        trio.lowlevel.notify_closing(sock)
        _discard_unread(sock)
        sock.close()


DISCARD_READS = 16
"""``recv`` calls spent on bytes nobody read, at most, before a connection's socket closes."""


def _discard_unread(sock: socket.socket) -> None:
    """Drop the bytes the peer sent that were never read (frames after its close
    frame, say): closing a socket with unread bytes resets the connection, and the
    peer could lose the last frames sent to it (the close frame)."""
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more is waiting
        for _ in range(DISCARD_READS):
            if not sock.recv(RECEIVE_BYTES * 16):
                return


_ENDED = (trio.BrokenResourceError, trio.ClosedResourceError)
"""The connection ended below the protocol; nothing is left to do but close the socket."""


async def _handshake(
    sock: socket.socket, writes: WriteStream, path: str
) -> tuple[bytes, bytes] | None:
    """The HTTP upgrade: the answer to send (101, not sent yet) and the bytes received
    after the request (frames), or ``None`` when the request is refused (a path
    not served: 404; not a WebSocket upgrade: 400 or 426) or the peer went away.
    wsproto judges the request; the answer is written here, as wsproto writes it
    for a connection without subprotocols or extensions (wsproto's own builds a
    connection object the gateway does not use). The handshake's state (h11's
    parser, the request) is dropped once it is over."""
    handshake = H11Handshake(ConnectionType.SERVER)
    tail = b""
    while True:
        data, _ = await _wait_recv(sock)
        if not data:
            return None
        joined = tail + data
        end = joined.find(_HTTP_END)
        after = b""
        if end >= 0:
            cut = end + len(_HTTP_END) - len(tail)
            data, after = data[:cut], data[cut:]
        else:
            tail = joined[-3:]
        try:
            handshake.receive_data(data)
        except RemoteProtocolError as exc:
            if exc.event_hint is not None:
                await writes.send_all(handshake.send(exc.event_hint))
            return None
        for event in handshake.events():
            if not isinstance(event, Request):
                continue
            if event.target.partition("?")[0] != path:
                await writes.send_all(handshake.send(RejectConnection(status_code=404)))
                return None
            key = normed_header_dict(event.extra_headers)[b"sec-websocket-key"]
            return _SWITCHING % generate_accept_token(key), after
        if end >= 0:  # the request ended and was not an upgrade h11 accepted
            return None
