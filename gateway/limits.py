"""The limit on connections that have not identified yet (no IO).

A connection counts from the moment its TCP connection is accepted until it
identifies (or ends): during the WebSocket upgrade and between ``hello`` and
``identify``. At most ``sync.max_unidentified_connections`` count at once per
node. A new connection beyond the limit does not wait and is not refused:
the *oldest* unidentified connection makes room for it. So a flood of
connections that never identify evicts its own members, while a client that
identifies promptly is never in the way for long enough to be evicted (the
flood would have to open the whole limit's worth of connections in the time
that client takes to identify).

Eviction runs the connection's callback: while it is still in the upgrade the
transport drops the TCP connection; from ``hello`` on the session closes it
with 4008 ``too many unidentified connections``.
"""

from __future__ import annotations

from collections.abc import Callable


class Pending:
    """One unidentified connection's place in :class:`PendingConnections`."""

    __slots__ = ("_evict", "_owner")

    def __init__(self, owner: PendingConnections, evict: Callable[[], None]) -> None:
        self._owner = owner
        self._evict = evict

    def __repr__(self) -> str:
        return "Pending()"

    def on_evicted(self, evict: Callable[[], None]) -> None:
        """What eviction does from now on (replaces the callback given at entry)."""
        self._evict = evict

    def leave(self) -> None:
        """The connection identified or ended: it no longer counts. Idempotent."""
        self._owner._entries.pop(self, None)


class PendingConnections:
    """Unidentified connections, oldest first, at most ``limit``.

    Args:
        limit: ``sync.max_unidentified_connections``.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[Pending, None] = {}  # insertion-ordered: the oldest first

    def __repr__(self) -> str:
        return f"PendingConnections({len(self._entries)}/{self._limit})"

    def __len__(self) -> int:
        return len(self._entries)

    def enter(self, evict: Callable[[], None]) -> Pending:
        """Count a new connection; evict the oldest ones while over the limit.

        ``evict`` ends this connection should it become the oldest one over
        the limit; it must not block.
        """
        while len(self._entries) >= self._limit:
            oldest = next(iter(self._entries))
            del self._entries[oldest]
            oldest._evict()
        entry = Pending(self, evict)
        self._entries[entry] = None
        return entry


class Cooldowns:
    """Devices closed with 4029 wait before they are served again (no IO; ``now`` given).

    A connection's bucket (``sync.ops_per_second``, ``sync.ops_burst``) dies with
    it, so a client that reconnects at once after 4029 would get a full burst
    again, and an identify (a token check and a transaction) on top. A device
    closed with 4029 is therefore refused with 4029 at identify, before any
    database work, until its bucket would have filled up again
    (``ops_burst / ops_per_second`` seconds). Clients reconnect with backoff
    after 4029 anyway; only those that do not are refused. (The session holds
    every 4029 back until then, too: see :mod:`gateway.session`.)

    This is the process's own record, checked before any database work. The
    session also writes the cooldown's end on the device's row, which every
    identify reads, so a device that reconnects to another process
    (``server.processes``) or node is refused there as well, after its identify
    transaction (:func:`gateway.queries.identify_many`).

    Args:
        limit: entries kept at most (the oldest expire first; past it the
            expired ones are dropped).
    """

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._until: dict[tuple[str, str], float] = {}

    def __repr__(self) -> str:
        return f"Cooldowns({len(self._until)})"

    def start(self, device: tuple[str, str], until: float) -> None:
        """``device`` (person, device id) is refused until ``until``."""
        if len(self._until) >= self._limit:
            now = min(self._until.values())
            self._until = {k: v for k, v in self._until.items() if v > now}
        self._until[device] = until

    def cooling(self, device: tuple[str, str], now: float) -> float | None:
        """Until when ``device`` is still refused at ``now``; ``None``: it is not."""
        until = self._until.get(device)
        if until is None:
            return None
        if until <= now:
            del self._until[device]
            return None
        return until
