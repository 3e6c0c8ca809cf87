"""The hub: every connection of this node, indexed by person and by device.

Indices: the principal index (person -> connections) and the device index
((person, device) -> connections). A device is identified by (person, device
id), so two people whose tokens carry the same device id never replace or
close each other's connections. A device holds one connection: when a newer
connection of the same device becomes live, the older ones close with 4017
(and a connection that finds a newer live one of its device closes itself),
so the device is reachable without a gap while the newer one catches up. In a
cluster the same holds across nodes: the node told that a newer connection of
the device is live elsewhere closes the older one here with 4017
(:meth:`Hub.close_replaced`, :mod:`gateway.revocations`).

Phases change only here, by the triggers of the state machine in
:mod:`gateway.protocol` (:class:`~gateway.protocol.ConnectionState`,
:data:`~gateway.protocol.TRANSITIONS`), and every change moves
``bothy_gateway_connections{phase}``. Mutations run in the Trio
thread; they hold a :class:`threading.Lock` only to change a few fields, so
the presence read (:meth:`Hub.presence`), which copies under the same lock,
may run in the consumer round's worker thread and never waits on a
connection.

In a cluster (``cluster.mode = "multi"``) the hub tells a watcher (the
shared presence publisher, :mod:`gateway.shared_presence`) whose presence may
have changed: a connection changed phase, focus or idle, or ended. The watcher
is called in the Trio thread, under the hub's lock, and only notes the person.

Each connection has a bounded outbound queue (``sync.outbound_queue_max``,
see :mod:`gateway.connection`); ephemeral frames that do not fit are dropped
and counted here (``bothy_gateway_dropped_total{reason="queue_full"}``).

A person holds at most ``sync.max_connections_per_person`` identified
connections on this node (:meth:`Hub.has_room`); a connection of a device
that already has one does not count against it, so a device can always
replace its own connection.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from bothy_notify.auth import DeviceClaims
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceEntry
from gateway.closes import REPLACED, Close
from gateway.connection import Connection
from gateway.protocol import Phase, Trigger

DROP_QUEUE_FULL = "queue_full"
"""``bothy_gateway_dropped_total{reason}``: the connection's outbound queue was full."""
DROP_NOT_ADMITTED = "not_admitted"
"""``bothy_gateway_dropped_total{reason}``: admission refused the frame."""

DeviceKey = tuple[str, str]
"""A device: (person, device id)."""


@dataclass(frozen=True, slots=True)
class HubStatistics:
    """A snapshot of the hub: connections by phase (tests, benchmarks)."""

    connecting: int
    catching_up: int
    live: int
    closing: int

    @property
    def total(self) -> int:
        """Connections in any phase."""
        return self.connecting + self.catching_up + self.live + self.closing


class Hub:
    """Connections of this node: indices, phases, closes, presence.

    Args:
        metrics: the registry (``bothy_gateway_connections``, ``_closed``, ``_dropped``).
        outbound_queue_max: ``sync.outbound_queue_max``.
        max_connections_per_person: ``sync.max_connections_per_person``
            (``None``: no limit).
    """

    def __init__(
        self,
        *,
        metrics: Metrics,
        outbound_queue_max: int,
        max_connections_per_person: int | None = None,
    ) -> None:
        self._max_per_person = max_connections_per_person
        self._lock = threading.Lock()
        self._serials = itertools.count(1)
        self._queue_max = outbound_queue_max
        self._all: dict[int, Connection] = {}
        self._by_user: dict[str, list[Connection]] = {}
        self._by_device: dict[DeviceKey, list[Connection]] = {}
        self._gauges = {p: metrics.gateway_connections.labels(p.value) for p in Phase}
        self._closed = metrics.gateway_closed
        self._dropped = {
            reason: metrics.gateway_dropped.labels(reason)
            for reason in (DROP_QUEUE_FULL, DROP_NOT_ADMITTED)
        }
        self._changed = trio.Event()
        self._watcher: Callable[[str], None] | None = None
        self.accepting = True
        """``False`` once :meth:`close_all` ran: new connections close at once."""
        self.stopping = trio.Event()
        """Set by :meth:`close_all`: closes held back (4029) go out at once."""

    def __repr__(self) -> str:
        return f"Hub(connections={len(self._all)})"

    def watch_presence(self, watcher: Callable[[str], None]) -> None:
        """Call ``watcher(user_id)`` whenever that person's presence may have changed.

        It runs in the Trio thread under the hub's lock: it must only take note
        (no hub call, no waiting). One watcher per hub.
        """
        self._watcher = watcher

    def _touch(self, conn: Connection) -> None:
        if self._watcher is not None and conn.user_id:
            self._watcher(conn.user_id)

    # -- life of a connection ---------------------------------------------------------

    def open(self) -> Connection:
        """Register a new connection in phase ``connecting``."""
        conn = Connection(next(self._serials), self._queue_max)
        with self._lock:
            self._all[conn.serial] = conn
        self._gauges[Phase.CONNECTING].inc()
        return conn

    def get(self, serial: int) -> Connection | None:
        """The connection ``serial``, while the hub knows it."""
        return self._all.get(serial)

    def identify(self, conn: Connection, claims: DeviceClaims) -> None:
        """Record the connection's principal and index it; phase ``catching_up``.

        It is indexed before the device row is read, so a revocation that
        commits meanwhile finds it (see :mod:`gateway.revocations`).
        """
        with self._lock:
            left = conn.advance(Trigger.IDENTIFIED)
            if left is None:
                return
            conn.user_id, conn.device_id = claims.user_id, claims.device_id
            conn.platform, conn.human = claims.platform, claims.is_human
            conn.kind = claims.kind
            self._by_user.setdefault(conn.user_id, []).append(conn)
            self._by_device.setdefault((conn.user_id, conn.device_id), []).append(conn)
            self._moved(conn, left)

    def has_room(self, claims: DeviceClaims) -> bool:
        """Whether the person of ``claims`` may identify one more connection here.

        Connections of the same device do not count: the newer one replaces them.
        """
        if self._max_per_person is None:
            return True
        with self._lock:
            others = sum(
                1 for c in self._by_user.get(claims.user_id, ()) if c.device_id != claims.device_id
            )
        return others < self._max_per_person

    def go_live(self, conn: Connection) -> bool:
        """Make the connection live (its ``catchup.complete`` is written).

        Older connections of the same device close with 4017. If a newer one
        is already live, this one is the replaced one and closes instead.
        Returns whether the connection is live.
        """
        with self._lock:
            if conn.phase is not Phase.CATCHING_UP:
                return False
            siblings = list(self._by_device.get((conn.user_id, conn.device_id), ()))
            if any(c.serial > conn.serial and c.phase is Phase.LIVE for c in siblings):
                self._close_locked(conn, REPLACED)
                return False
            left = conn.advance(Trigger.CAUGHT_UP)
            assert left is not None
            self._moved(conn, left)
            for older in siblings:
                if older.serial < conn.serial:
                    self._close_locked(older, REPLACED)
            return True

    def set_focus(self, conn: Connection, focus: frozenset[str], idle: bool) -> None:
        """Store the accepted focus (readable threads only) and the idle flag."""
        with self._lock:
            conn.focus, conn.idle = focus, idle
            self._touch(conn)

    def close(self, conn: Connection, close: Close) -> None:
        """Decide to close ``conn`` with ``close``: phase ``closing``, out of the
        indices, its session cancelled (the session sends the close frame).
        A second close of the same connection changes nothing."""
        with self._lock:
            self._close_locked(conn, close)

    def lost(self, conn: Connection) -> None:
        """The peer closed the connection or it broke: phase ``closing``, out of
        the indices, its session cancelled (no close frame is sent)."""
        with self._lock:
            left = conn.advance(Trigger.CLOSE)
            if left is not None:
                self._moved(conn, left)
            self._unindex(conn)
        conn.scope.cancel()

    def ended(self, conn: Connection, peer_code: int | None = None) -> None:
        """The session is over: forget the connection.

        ``peer_code`` is the close code the client sent, if it closed first.
        """
        with self._lock:
            self._unindex(conn)
            self._all.pop(conn.serial, None)
            phase = conn.phase
            self._touch(conn)
        self._gauges[phase].dec()
        if conn.close is None:
            self._closed.labels("peer" if peer_code is not None else "abnormal").inc()
        self._wake()

    def _close_locked(self, conn: Connection, close: Close) -> None:
        if not conn.decide(close):
            return
        left = conn.advance(Trigger.CLOSE)
        if left is not None:
            self._moved(conn, left)
        self._unindex(conn)
        self._closed.labels(str(int(close.code))).inc()
        conn.scope.cancel()

    def _unindex(self, conn: Connection) -> None:
        _drop(self._by_user, conn.user_id, conn)
        _drop(self._by_device, (conn.user_id, conn.device_id), conn)

    def _moved(self, conn: Connection, left: Phase) -> None:
        """``conn`` left phase ``left`` for its current one: the gauges, the watcher."""
        self._gauges[left].dec()
        self._gauges[conn.phase].inc()
        self._touch(conn)

    # -- reads -------------------------------------------------------------------------

    def presence(self, user_ids: Collection[str]) -> Mapping[str, tuple[PresenceEntry, ...]]:
        """Presence facts of ``user_ids`` (see :class:`gateway.presence.HubPresence`)."""
        with self._lock:
            return {
                user_id: tuple(_entry(c) for c in counted)
                for user_id in user_ids
                if (counted := self._counted_locked(user_id))
            }

    def shared_presence(self, user_ids: Collection[str]) -> list[tuple[str, PresenceEntry, int]]:
        """(person, entry, connection serial) of the connections :meth:`presence`
        counts: what a cluster node publishes (the serial names the connection
        when another node replaces it, :meth:`close_replaced`)."""
        with self._lock:
            return [
                (user_id, _entry(c), c.serial)
                for user_id in user_ids
                for c in self._counted_locked(user_id)
            ]

    def _counted_locked(self, user_id: str) -> list[Connection]:
        """The newest live human connection of each of the person's devices."""
        per_device: dict[str, Connection] = {}
        for conn in self._by_user.get(user_id, ()):
            if not conn.human or conn.phase is not Phase.LIVE:
                continue
            seen = per_device.get(conn.device_id)
            if seen is None or conn.serial > seen.serial:
                per_device[conn.device_id] = conn
        return list(per_device.values())

    def live_connections(self, user_id: str) -> list[Connection]:
        """The live connections of one person (any principal kind), oldest first."""
        with self._lock:
            group = self._by_user.get(user_id)
            if not group:
                return []
            return [c for c in group if c.phase is Phase.LIVE]

    def devices(self) -> list[DeviceKey]:
        """Devices, as (person, device id), with an identified connection on this node."""
        with self._lock:
            return list(self._by_device)

    def user_ids(self) -> list[str]:
        """People with an identified connection on this node."""
        with self._lock:
            return list(self._by_user)

    def statistics(self) -> HubStatistics:
        """Connections by phase."""
        with self._lock:
            counts = {p: 0 for p in Phase}
            for conn in self._all.values():
                counts[conn.phase] += 1
        return HubStatistics(
            counts[Phase.CONNECTING],
            counts[Phase.CATCHING_UP],
            counts[Phase.LIVE],
            counts[Phase.CLOSING],
        )

    def count_dropped(self, reason: str, amount: int = 1) -> None:
        """Count ephemeral frames not queued: ``queue_full`` or ``not_admitted``."""
        self._dropped[reason].inc(amount)

    # -- closing many ----------------------------------------------------------------

    def close_device(self, user_id: str, device_id: str, close: Close) -> int:
        """Close every connection of one person's device; returns how many."""
        with self._lock:
            group = list(self._by_device.get((user_id, device_id), ()))
            for conn in group:
                self._close_locked(conn, close)
        return len(group)

    def close_replaced(self, user_id: str, device_id: str, serial: int) -> bool:
        """Close the connection ``serial`` of one person's device with 4017: a newer
        connection of the device is live on another node of the cluster. Returns
        whether it was still here (a connection ended meanwhile is left alone)."""
        with self._lock:
            for conn in self._by_device.get((user_id, device_id), ()):
                if conn.serial == serial:
                    self._close_locked(conn, REPLACED)
                    return True
        return False

    def close_user(self, user_id: str, close: Close) -> int:
        """Close every identified connection of ``user_id``; returns how many."""
        with self._lock:
            group = list(self._by_user.get(user_id, ()))
            for conn in group:
                self._close_locked(conn, close)
        return len(group)

    def close_all(self, close: Close) -> None:
        """Stop accepting and close every connection (shutdown: 1001)."""
        with self._lock:
            self.accepting = False
            for conn in list(self._all.values()):
                self._close_locked(conn, close)
        self.stopping.set()

    async def wait_empty(self) -> None:
        """Return once no connection is left. Cancellation: returns nothing early."""
        while self._all:
            await self._changed.wait()

    def _wake(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()


def _entry(conn: Connection) -> PresenceEntry:
    return PresenceEntry(conn.device_id, conn.platform, conn.focus, conn.idle)


def _drop(index: dict[Any, list[Connection]], key: object, conn: Connection) -> None:
    group = index.get(key)
    if group is not None and conn in group:
        group.remove(conn)
        if not group:
            del index[key]
