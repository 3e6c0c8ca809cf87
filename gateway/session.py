"""One connection's conversation: hello, identify, catch-up, then ops until it ends.

:func:`serve_session` runs in the task the listener gave the connection.
Replies are written at once when the socket takes them (most do); otherwise
the connection's writer runs, while frames are queued, in the connection's
nursery (:class:`QueueWriter`), each write bounded by ``sync.write_timeout``
(a stalled write closes with 4014). Every way out goes through the hub:

- the client breaks the protocol: :class:`~gateway.errors.ProtocolViolation`
  -> ``hub.close(conn, its close)``; frames past the connection's bucket:
  4029 (``bothy_gateway_rate_limited_total``), sent once the bucket would be
  full again (``ops_burst / ops_per_second`` seconds; nothing is read
  meanwhile), and the device is refused with 4029 at identify until then: at
  once by this process (:class:`~gateway.limits.Cooldowns`, before any database
  work), and by every process and node through the device's row, where the
  cooldown's end is written while the close is held back
  (:func:`gateway.queries.start_cooldown`; an identify elsewhere reads it);
- the server decides (replacement 4017, revocation or deactivation 4010,
  shutdown 1001, a stalled write 4014, the token's expiry 4001, the limit of
  unidentified connections 4008, a timeout 4003 or 4009): ``hub.close``
  cancels the session's scope;
- serving an op fails (the database cannot be reached, or anything
  unexpected): 1011 ``server error``, so a client always gets a close code;
- the peer closes or the connection breaks: ``hub.lost``.

Then the session sends the decided close frame, bounded by
``sync.write_timeout`` in a shielded scope (a close frame is a write), and the
hub forgets the connection.

Timers: the client has ``sync.identify_timeout`` after hello to identify
(else 4003), and once identified must send some frame (``ping`` is the
heartbeat) within :data:`HEARTBEAT_GRACE` times ``sync.heartbeat`` (else
4009). The session only stamps when it begins to wait for a frame
(``conn.idle_since``); :class:`~gateway.timeouts.Timeouts` closes the silent
ones. The token's expiry is watched by :class:`~gateway.expiry.ExpiryWatch`
on the injected clock; ``reauth`` moves it.

Limits: until it identifies, a connection counts against
``sync.max_unidentified_connections`` (:mod:`gateway.limits`; evicted: 4008);
at identify the person must have room under ``sync.max_connections_per_person``
(else 4008).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import trio
from prometheus_client import Histogram

from bothy_notify.auth import AuthError, DeviceClaims, TokenVerifier
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.store.db import Database, StoreError
from bothy_notify.store.marks import Clearing
from gateway import queries
from gateway.closes import (
    AUTH_FAILED,
    DEACTIVATED,
    FRAME_TOO_LARGE,
    FRAMING_BROKEN,
    INVALID_TEXT,
    REVOKED,
    SERVER_ERROR,
    SHUTDOWN,
    TOO_MANY_FOR_PERSON,
    TOO_MANY_FRAMES,
    TOO_MANY_UNIDENTIFIED,
    WRITE_STALLED,
    CloseCode,
)
from gateway.connection import Connection, Outbound
from gateway.errors import (
    FrameTooLarge,
    FramingError,
    ProtocolViolation,
    Throttled,
    TooManyFrames,
    TransportClosed,
)
from gateway.expiry import ExpiryWatch
from gateway.hub import Hub
from gateway.identifies import IdentifyBatches
from gateway.limits import Cooldowns
from gateway.protocol import (
    PING,
    ClientOp,
    Focus,
    Identify,
    Read,
    Reauth,
    catchup_complete_frame,
    decode_client_frame,
    focus_ack_frame,
    hello_frame,
    pong_frame,
    read_ack_frame,
    ready_frame,
    reauth_ack_frame,
    unread_frame,
)
from gateway.timeouts import Timeouts
from gateway.transport import Transport

log = logging.getLogger("bothy.gateway.session")

HEARTBEAT_GRACE = 1.5
"""A client may be this many heartbeat intervals late before 4009 (one lost beat is fine)."""

PONG = pong_frame()
"""The answer to every ``ping``."""
CATCHUP_COMPLETE = catchup_complete_frame()
"""The last frame of every catch-up."""


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """The ``sync.*`` settings a session needs, in the units it uses.

    Attributes:
        heartbeat_ms: ``sync.heartbeat``, told to the client in hello.
        identify_timeout: ``sync.identify_timeout`` in seconds.
        write_timeout: ``sync.write_timeout`` in seconds.
        max_focused_threads: ``sync.max_focused_threads``.
        ops_per_second, ops_burst: ``sync.ops_per_second``, ``sync.ops_burst``
            (the bucket of each connection's frames).
    """

    heartbeat_ms: int
    identify_timeout: float
    write_timeout: float
    max_focused_threads: int
    ops_per_second: float = 10.0
    ops_burst: int = 50

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds without a client frame before 4009."""
        return self.heartbeat_ms / 1000 * HEARTBEAT_GRACE

    @property
    def hello(self) -> str:
        """The hello frame every connection gets first."""
        return hello_frame(self.heartbeat_ms)


class QueueWriter:
    """Writes a connection's queued frames, each within ``sync.write_timeout``.

    A write that does not finish in time closes the connection with 4014 (the
    unsent part of the frame is kept by the transport, so the close frame
    still follows a whole frame). Writing an ephemeral event's frame observes
    ``bothy_delivery_seconds{route="gateway"}`` from the event's append.

    Args:
        hub: told when a write stalls or the connection is gone.
        write_timeout: ``sync.write_timeout`` in seconds.
        delivery: the ``route="gateway"`` child of ``bothy_delivery_seconds``.
        instrument: told of every frame given to a socket (a part of it may wait
            in the transport until the socket takes it).
    """

    __slots__ = ("_delivery", "_hub", "_instrument", "_timeout")

    def __init__(
        self,
        *,
        hub: Hub,
        write_timeout: float,
        delivery: Histogram,
        instrument: Instrument | None = None,
    ) -> None:
        self._hub = hub
        self._timeout = write_timeout
        self._delivery = delivery
        self._instrument = instrument

    def __repr__(self) -> str:
        return f"QueueWriter(write_timeout={self._timeout})"

    def write_now(self, conn: Connection, frames: Sequence[Outbound]) -> bool:
        """Write ``frames`` at once if the socket takes all of them (one write, no
        task, no timer); ``False``: :meth:`drain` must send the rest (the last
        frame's delivery is observed then)."""
        transport = conn.transport
        assert transport is not None
        try:
            written = transport.send_nowait(*(text for text, _ in frames))
        except TransportClosed:
            self._hub.lost(conn)
            return True
        if self._instrument is not None:
            for text, _ in frames:
                self._instrument.frame_written(text)
        if not written:
            conn.pending_delivery = frames[-1][1]
            return False
        for _, appended_at in frames:
            self._delivered(appended_at)
        return True

    async def drain(self, conn: Connection) -> None:
        """Send what :meth:`write_now` left, then the queue until it is empty.
        Cancellation: the frame being written is finished by the transport
        before anything else it sends."""
        transport = conn.transport
        assert transport is not None
        appended_at, conn.pending_delivery = conn.pending_delivery, None
        while True:
            with trio.move_on_after(self._timeout) as scope:
                try:
                    await transport.flush()
                except TransportClosed:
                    self._hub.lost(conn)
                    return
            if scope.cancelled_caught:
                self._hub.close(conn, WRITE_STALLED)
                return
            self._delivered(appended_at)
            while (frame := conn.take()) is not None:
                text, appended_at = frame
                try:
                    written = transport.send_nowait(text)
                except TransportClosed:
                    self._hub.lost(conn)
                    return
                if self._instrument is not None:
                    self._instrument.frame_written(text)
                if not written:
                    break  # the rest is flushed within the timeout
                self._delivered(appended_at)
            else:
                return

    def _delivered(self, appended_at: float | None) -> None:
        if appended_at is not None:
            self._delivery.observe(max(0.0, time.time() - appended_at))


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What every session of one gateway shares.

    ``presence_published`` (a cluster only) returns once this node's presence
    changes so far are shared with the other nodes; ``focus.ack`` waits for it,
    so a focus is in effect on every node when the client hears it was taken.
    """

    hub: Hub
    db: Database
    verifier: TokenVerifier
    settings: SessionSettings
    writer: QueueWriter
    expiry: ExpiryWatch
    timeouts: Timeouts
    identifies: IdentifyBatches
    cooldowns: Cooldowns
    rate_limited: Callable[[], None]
    presence_published: Callable[[], Awaitable[None]] | None = None
    clearing: Callable[[], Clearing | None] = lambda: None
    """How a ``read`` op queues its clears now (``push.clear_on_read``); ``None``:
    it queues none."""


async def serve_session(transport: Transport, nursery: trio.Nursery, ctx: SessionContext) -> None:
    """Run one connection from hello to its close.

    Args:
        transport: the connection.
        nursery: the connection's nursery (its writer runs there).
        ctx: what the gateway's sessions share.

    Cancellation from outside (the listener stops) ends the session without a
    close frame; the transport is closed by the listener.
    """
    hub = ctx.hub
    conn = hub.open()
    conn.attach(transport, nursery, ctx.writer)
    transport.on_evicted(partial(hub.close, conn, TOO_MANY_UNIDENTIFIED))
    conn.idle_since = trio.current_time()
    ctx.timeouts.watch(conn.serial, conn.idle_since)
    peer_code: int | None = None
    hold_until = 0.0
    cooldown = 0.0  # seconds of a 4029 cooldown to share with every process and node
    try:
        if not hub.accepting:
            hub.close(conn, SHUTDOWN)
        with conn.scope:
            try:
                await _converse(transport, conn, ctx)
            except Throttled as exc:
                hold_until = exc.until
                hub.close(conn, exc.close)
            except ProtocolViolation as exc:
                hub.close(conn, exc.close)
            except FrameTooLarge:
                hub.close(conn, FRAME_TOO_LARGE)
            except FramingError as exc:
                hub.close(
                    conn, INVALID_TEXT if exc.code == CloseCode.INVALID_TEXT else FRAMING_BROKEN
                )
            except TooManyFrames:
                ctx.rate_limited()
                settings = ctx.settings
                cooldown = settings.ops_burst / settings.ops_per_second
                hold_until = trio.current_time() + cooldown
                if conn.device_id:
                    ctx.cooldowns.start((conn.user_id, conn.device_id), hold_until)
                hub.close(conn, TOO_MANY_FRAMES)
            except TransportClosed as exc:
                peer_code = exc.code
                hub.lost(conn)
            except StoreError:  # the store logs why; the client is told to come back later
                hub.close(conn, SERVER_ERROR)
            except Exception as exc:  # never end a connection without a close code
                log.warning("gateway session failed", extra={"error_type": type(exc).__name__})
                hub.close(conn, SERVER_ERROR)
        close = conn.close
        if hold_until:
            # 4029 goes out once the bucket would be full again; meanwhile nothing is
            # read, so a flooding client waits on its own socket instead of
            # reconnecting (the node's shutdown ends the wait).
            with trio.move_on_at(hold_until):
                if cooldown and conn.device_id:
                    await _share_cooldown(ctx, conn.user_id, conn.device_id, cooldown)
                await hub.stopping.wait()
        if close is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(ctx.settings.write_timeout):
                await transport.close(close.code, close.reason)
    finally:
        ctx.expiry.forget(conn)
        hub.ended(conn, peer_code)


async def _share_cooldown(
    ctx: SessionContext, user_id: str, device_id: str, seconds: float
) -> None:
    """Write the device's 4029 cooldown on its row, so that an identify on any process
    or node refuses it (this process's :class:`Cooldowns` already does). A database
    that cannot take it leaves the cooldown to this process, logged."""
    try:
        await ctx.db.run(
            partial(queries.start_cooldown, user_id=user_id, device_id=device_id, seconds=seconds)
        )
    except StoreError as exc:
        log.warning(
            "a 4029 cooldown was not stored: only this process refuses the device",
            extra={"error_type": type(exc).__name__},
        )


async def _converse(transport: Transport, conn: Connection, ctx: SessionContext) -> None:
    """The protocol: hello, identify, then ops until the connection ends. Before
    each wait for a client frame the session stamps ``conn.idle_since`` (its
    timeouts count from it), and while it serves one the stamp is ``inf``."""
    await _hello(transport, conn, ctx)
    while True:
        conn.idle_since = trio.current_time()
        message = await transport.receive()
        conn.idle_since = math.inf
        op = _decode(message, conn, ctx)
        if op is PING:
            await conn.put(PONG)
        elif isinstance(op, Focus):
            await _focus(op, conn, ctx)
        elif isinstance(op, Read):
            await _read(op, conn, ctx)
        elif isinstance(op, Reauth):
            await _reauth(op, conn, ctx)


async def _hello(transport: Transport, conn: Connection, ctx: SessionContext) -> None:
    """Hello, then the client's identify. Its own function, so the identify frame
    (and its token) is not kept while the connection waits for the next frame."""
    await conn.put(ctx.settings.hello)
    message = await transport.receive()
    conn.idle_since = math.inf
    op = _decode(message, conn, ctx)
    assert isinstance(op, Identify)  # check admits nothing else before identify
    await _identify(op, conn, ctx)


def _decode(message: str | bytes, conn: Connection, ctx: SessionContext) -> ClientOp:
    op = decode_client_frame(message, max_focused_threads=ctx.settings.max_focused_threads)
    conn.check(op)
    return op


async def _identify(op: Identify, conn: Connection, ctx: SessionContext) -> None:
    claims = _verified(op.token, ctx)
    until = ctx.cooldowns.cooling((claims.user_id, claims.device_id), trio.current_time())
    if until is not None:
        ctx.rate_limited()
        raise Throttled(TOO_MANY_FRAMES, until)
    if not ctx.hub.has_room(claims):
        raise ProtocolViolation(TOO_MANY_FOR_PERSON)
    ctx.hub.identify(conn, claims)
    assert conn.transport is not None
    conn.transport.identified()
    ctx.expiry.watch(conn, claims.expires_at)
    state, unread, cooling = await ctx.identifies.identify(claims)
    if state == "revoked":
        raise ProtocolViolation(REVOKED)
    if state == queries.DEACTIVATED:
        raise ProtocolViolation(DEACTIVATED)
    if cooling > 0:  # closed with 4029 on another process or node
        until = trio.current_time() + cooling
        ctx.cooldowns.start((claims.user_id, claims.device_id), until)
        ctx.rate_limited()
        raise Throttled(TOO_MANY_FRAMES, until)
    await conn.put_all(
        (ready_frame(claims.user_id, claims.device_id), unread_frame(unread), CATCHUP_COMPLETE)
    )
    await conn.wait_written()  # live means the client can have catchup.complete
    ctx.hub.go_live(conn)


async def _focus(op: Focus, conn: Connection, ctx: SessionContext) -> None:
    kept: list[str] = []
    if op.thread_ids:
        kept = await ctx.db.run(
            partial(queries.readable_threads, user_id=conn.user_id, thread_ids=op.thread_ids)
        )
    ctx.hub.set_focus(conn, frozenset(kept), op.idle)
    if ctx.presence_published is not None:
        await ctx.presence_published()
    await conn.put(focus_ack_frame(kept))


async def _read(op: Read, conn: Connection, ctx: SessionContext) -> None:
    """Store the position when the person may read the thread; ``read.ack`` carries
    the stored position either way (unchanged for a thread they cannot read)."""
    stored = await ctx.db.run(
        partial(
            queries.mark_read,
            user_id=conn.user_id,
            thread_id=op.thread_id,
            seq=op.seq,
            device_id=conn.device_id,
            clearing=ctx.clearing(),
        )
    )
    await conn.put(read_ack_frame(op.thread_id, stored))


async def _reauth(op: Reauth, conn: Connection, ctx: SessionContext) -> None:
    """A fresh token of the same identity moves the connection's expiry; any other
    token closes it with 4001."""
    claims = _verified(op.token, ctx)
    identity = (claims.user_id, claims.device_id, claims.platform, claims.kind)
    if identity != (conn.user_id, conn.device_id, conn.platform, conn.kind):
        raise ProtocolViolation(AUTH_FAILED)
    assert claims.expires_at is not None  # a verified token always has one
    ctx.expiry.watch(conn, claims.expires_at)
    await conn.put(reauth_ack_frame(int(claims.expires_at.timestamp())))


def _verified(token: str, ctx: SessionContext) -> DeviceClaims:
    try:
        return ctx.verifier.device(token)
    except AuthError:
        raise ProtocolViolation(AUTH_FAILED) from None
