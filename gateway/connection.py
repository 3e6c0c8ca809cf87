"""One connection's state and its bounded outbound queue.

The queue holds at most ``sync.outbound_queue_max`` frames, in order:

- ephemeral frames are *offered* (:meth:`Connection.offer`): queued without
  waiting, or dropped when the queue is full (the caller counts the drop);
  a full queue is never a reason to close;
- replies of the session are *put* (:meth:`Connection.put`): they wait for
  room, so a client that does not read stops being read (backpressure).

A frame queued while nothing is queued or being written is first offered to
the socket at once (:meth:`Writer.write_now`): a reply that fits in the
socket's buffer (a ``pong``, most acks and hints) costs no task and no timer.
Otherwise a writer task drains the queue while it has frames and ends when
it is empty; it is started on demand in the connection's nursery, so an idle
connection holds no writer (memory per connection is a product target). The
writing itself (timeouts, close on a stalled write) belongs to a
:class:`Writer` shared by all connections of a gateway.

The connection's phase and decided close are its
:class:`~gateway.protocol.ConnectionState` (the state machine of
:mod:`gateway.protocol`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from gateway.protocol import ConnectionState, Phase

if TYPE_CHECKING:
    from gateway.transport import Transport

NO_FOCUS: frozenset[str] = frozenset()
"""The focus of a connection that never sent one (shared: one less object per connection)."""

Outbound = tuple[str, float | None]
"""A frame to write: its JSON text and, for an ephemeral event, the Unix time its
event was appended (for ``bothy_delivery_seconds{route="gateway"}``)."""


class Writer(Protocol):
    """Drains a connection's queue into its transport (see ``gateway.session``)."""

    def write_now(self, conn: Connection, frames: Sequence[Outbound]) -> bool:
        """Write ``frames`` without waiting if the socket takes all of them (one
        write); ``False``: :meth:`drain` must run (it first sends what the socket
        did not take)."""
        ...

    async def drain(self, conn: Connection) -> None:
        """Write what :meth:`write_now` left, then queued frames, until the queue is
        empty or the connection ends."""
        ...


class Connection(ConnectionState):
    """One gateway connection: principal, phase, focus, and its outbound queue.

    The hub changes phase, principal and focus in the Trio thread under its
    lock; other threads read them under the same lock. The repr shows no IDs.

    Attributes:
        serial: order of acceptance on this node (newer is larger).
        phase: where the connection is (:class:`~gateway.protocol.Phase`).
        user_id, device_id, platform, kind, human: from the identify token's claims.
        focus: readable threads the device reported in focus (immutable).
        idle: whether the device reported itself idle.
        close: the close the server decided, once it decided one.
        scope: cancels the connection's session when the hub closes it.
        transport: the WebSocket connection, once the session attached one.
        idle_since: when (Trio's clock) the session last began to wait for a
            client frame; ``inf`` while it serves one (the identify and
            heartbeat timeouts count from it, :mod:`gateway.timeouts`).
        pending_delivery: the append time of an ephemeral frame that
            :meth:`Writer.write_now` left partly written (its delivery is
            observed once the rest is out).
    """

    __slots__ = (
        "_flushed",
        "_nursery",
        "_queue",
        "_queue_max",
        "_room",
        "_writer",
        "_writing",
        "device_id",
        "focus",
        "human",
        "idle",
        "idle_since",
        "kind",
        "pending_delivery",
        "platform",
        "scope",
        "serial",
        "transport",
        "user_id",
    )

    def __init__(self, serial: int, queue_max: int) -> None:
        super().__init__()
        self.serial = serial
        self.idle_since = math.inf
        self.pending_delivery: float | None = None
        self.user_id = ""
        self.device_id = ""
        self.platform = ""
        self.kind = ""
        self.human = False
        self.focus = NO_FOCUS
        self.idle = False
        self.scope = trio.CancelScope()
        self.transport: Transport | None = None
        self._queue: list[Outbound] = []
        self._queue_max = queue_max
        self._room: trio.Event | None = None
        self._flushed: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._writer: Writer | None = None
        self._writing = False

    def __repr__(self) -> str:
        return f"Connection(serial={self.serial}, phase={self.phase.value!r})"

    def attach(self, transport: Transport, nursery: trio.Nursery, writer: Writer) -> None:
        """Give the connection its transport and where to run its writer."""
        self.transport, self._nursery, self._writer = transport, nursery, writer

    def offer(self, text: str, appended_at: float | None) -> bool:
        """Queue an ephemeral frame without waiting.

        Returns ``False`` (dropped) when the queue is full or the connection is
        not live.
        """
        if self.phase is not Phase.LIVE or len(self._queue) >= self._queue_max:
            return False
        self._enqueue((text, appended_at))
        return True

    async def put(self, text: str) -> None:
        """Queue a reply, waiting for room. Cancellation: nothing is queued."""
        while len(self._queue) >= self._queue_max:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        self._enqueue((text, None))

    async def put_all(self, texts: Sequence[str]) -> None:
        """Queue replies in order, written in one go when the socket takes them (a
        queue shorter than ``texts`` takes them all once it is empty)."""
        while self._queue and len(self._queue) + len(texts) > self._queue_max:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        self._enqueue(*[(text, None) for text in texts])

    async def wait_written(self) -> None:
        """Return once every queued frame was handed to the transport.

        A writer that stopped early (stalled or broken) is always followed by
        the hub cancelling the session, which ends this wait.
        """
        while self._queue or self._writing:
            if self._flushed is None:
                self._flushed = trio.Event()
            await self._flushed.wait()

    def take(self) -> Outbound | None:
        """The next frame to write (the writer's side), or ``None`` when empty."""
        if not self._queue:
            return None
        frame = self._queue.pop(0)
        if self._room is not None:
            self._room.set()
            self._room = None
        return frame

    def queued(self) -> int:
        """Frames waiting to be written."""
        return len(self._queue)

    def _enqueue(self, *frames: Outbound) -> None:
        writer = self._writer
        if self._writing or self._nursery is None or writer is None:
            self._queue.extend(frames)
            return
        if self._queue:
            self._queue.extend(frames)
        elif writer.write_now(self, frames):
            return
        try:
            self._nursery.start_soon(self._write)
        except RuntimeError:  # the connection's nursery has closed: the connection is over
            return
        self._writing = True

    async def _write(self) -> None:
        assert self._writer is not None
        try:
            await self._writer.drain(self)
        finally:
            self._writing = False
            if self._flushed is not None:
                self._flushed.set()
                self._flushed = None
