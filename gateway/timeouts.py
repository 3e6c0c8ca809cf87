"""The identify and heartbeat timeouts of every connection: one task, one heap.

A connection must identify within ``sync.identify_timeout`` of its hello
(else 4003 ``identify timeout``) and, once identified, send some frame within
``HEARTBEAT_GRACE`` times ``sync.heartbeat`` (else 4009; :mod:`gateway.session`). Both count from
:attr:`Connection.idle_since <gateway.connection.Connection.idle_since>`,
the moment the session last began to wait for a client frame (``inf`` while
it serves one: a slow database never times a client out).

Nothing is done per frame but that one stamp: the heap holds one entry per
connection, (deadline, serial), and the watch sleeps on Trio's clock until
the earliest. An entry that comes due looks at its connection again: gone or
closing, it is dropped; still silent past its timeout, the hub closes it;
otherwise it goes back with the deadline its connection has now. So a
connection that heartbeats costs the watch one heap entry per timeout, not
one per ping, and no cancel scope changes its deadline on every frame. The
watch wakes at most once per :data:`GRANULARITY`, so a timeout closes up to
that much late.
"""

from __future__ import annotations

import heapq
import math

import trio

from gateway.closes import HEARTBEAT_TIMEOUT, IDENTIFY_TIMEOUT
from gateway.hub import Hub
from gateway.protocol import Phase

GRANULARITY = 0.05
"""Seconds the watch lets pass between two wake-ups at least."""


class Timeouts:
    """The identify and heartbeat timeouts of a gateway's connections.

    Args:
        hub: the connections (closed through it).
        identify_timeout: ``sync.identify_timeout`` in seconds.
        heartbeat_timeout: seconds without a client frame before 4009.
    """

    def __init__(self, *, hub: Hub, identify_timeout: float, heartbeat_timeout: float) -> None:
        self._hub = hub
        self._identify = identify_timeout
        self._heartbeat = heartbeat_timeout
        self._heap: list[tuple[float, int]] = []
        self._sleep: trio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"Timeouts(connections={len(self._heap)})"

    def watch(self, serial: int, idle_since: float) -> None:
        """Watch the connection ``serial``, which began to wait for its identify at
        ``idle_since``."""
        deadline = idle_since + self._identify
        heapq.heappush(self._heap, (deadline, serial))
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = max(deadline, trio.current_time() + GRANULARITY)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Close connections past their timeout until cancelled."""
        task_status.started()
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, serial = heapq.heappop(heap)
                conn = self._hub.get(serial)
                if conn is None or conn.phase is Phase.CLOSING:
                    continue
                connecting = conn.phase is Phase.CONNECTING
                due = conn.idle_since + (self._identify if connecting else self._heartbeat)
                if due <= now:
                    self._hub.close(conn, IDENTIFY_TIMEOUT if connecting else HEARTBEAT_TIMEOUT)
                else:
                    if math.isinf(due):  # serving a frame: look again a timeout later
                        due = now + (self._identify if connecting else self._heartbeat)
                    heapq.heappush(heap, (due, serial))
            wake = max(heap[0][0], now + GRANULARITY) if heap else math.inf
            with trio.CancelScope(deadline=wake) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
