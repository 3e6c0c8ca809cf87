"""Closing connections whose token expired (close code 4001, ``token expired``).

A connection may live only as long as the token it identified with: until the
token's ``exp`` plus ``auth.leeway`` (the skew the verifier allows too), as
:func:`bothy_notify.auth.accepted_until` computes it for the verifier's
claims: saturated at the latest instant a ``datetime`` holds, so the largest
``exp`` a token carries is watched like any other. A ``reauth`` op with a
fresh token of the same identity moves that deadline.

One task per gateway keeps every deadline in a heap and sleeps on the
injected clock until the earliest one, so tests move time with a fake clock.
Heap entries are ``(deadline, serial)``: an entry whose deadline a ``reauth``
moved, or whose connection ended, is skipped when it comes due, and the heap
is rebuilt from the watched connections when such stale entries outnumber
them.
"""

from __future__ import annotations

import heapq
from datetime import datetime, timedelta

import trio

from bothy_notify.auth import accepted_until
from bothy_notify.kernel.clock import Clock
from gateway.closes import TOKEN_EXPIRED
from gateway.connection import Connection
from gateway.hub import Hub

COMPACT_SLACK = 64
"""Stale heap entries tolerated beyond the number of watched connections."""


class ExpiryWatch:
    """Closes each watched connection at its token's expiry plus ``auth.leeway``.

    Args:
        hub: the connections (and the one way to close them).
        clock: the injected clock (``SystemClock`` in production).
        leeway: ``auth.leeway``.
    """

    def __init__(self, *, hub: Hub, clock: Clock, leeway: timedelta) -> None:
        self._hub = hub
        self._clock = clock
        self._leeway = leeway
        self._heap: list[tuple[datetime, int]] = []
        self._watched: dict[int, tuple[Connection, datetime]] = {}
        self._sleep: trio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"ExpiryWatch(watched={len(self._watched)})"

    def __len__(self) -> int:
        """Connections watched."""
        return len(self._watched)

    def watch(self, conn: Connection, expires_at: datetime | None) -> None:
        """Close ``conn`` at ``expires_at`` + leeway, replacing its earlier deadline.

        ``None`` (claims not read from a token) watches nothing.
        """
        if expires_at is None:
            return
        deadline = accepted_until(expires_at, self._leeway)
        earliest = self._heap[0][0] if self._heap else None
        self._watched[conn.serial] = (conn, deadline)
        heapq.heappush(self._heap, (deadline, conn.serial))
        self._compact_if_stale()
        if self._sleep is not None and (earliest is None or deadline < earliest):
            self._sleep.cancel()  # a new earliest deadline: sleep until that one instead

    def forget(self, conn: Connection) -> None:
        """The connection ended: stop watching it."""
        if self._watched.pop(conn.serial, None) is not None:
            self._compact_if_stale()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Close connections as their deadlines pass, until cancelled.

        The deadlines live in this object, so a run started again after a failure
        (the gateway supervises it) goes on with every watched connection.
        """
        task_status.started()
        try:
            await self._close_when_due()
        finally:
            self._sleep = None

    async def _close_when_due(self) -> None:
        while True:
            now = self._clock.now()
            while self._heap and self._heap[0][0] <= now:
                deadline, serial = heapq.heappop(self._heap)
                watched = self._watched.get(serial)
                if watched is not None and watched[1] == deadline:
                    del self._watched[serial]
                    self._hub.close(watched[0], TOKEN_EXPIRED)
            with trio.CancelScope() as self._sleep:
                if self._heap:
                    await self._clock.sleep_until(self._heap[0][0])
                else:
                    await trio.sleep_forever()
            self._sleep = None

    def _compact_if_stale(self) -> None:
        if len(self._heap) <= 2 * len(self._watched) + COMPACT_SLACK:
            return
        self._heap = [(deadline, serial) for serial, (_, deadline) in self._watched.items()]
        heapq.heapify(self._heap)
