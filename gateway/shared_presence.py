"""This node's presence, shared with the cluster (``cluster.mode = "multi"``).

The hub tells the publisher whose presence may have changed
(:meth:`Hub.watch_presence`); the publisher only notes the person. A
background task writes batches: it wakes at the first change, waits until
:data:`PUBLISH_INTERVAL` has passed since its previous write (so a burst of
focus changes or a reconnect storm becomes one write), then, in a worker
thread, reads the current entries of every noted person through
:meth:`Hub.shared_presence` (the same copy the local presence view makes, so
exactly the facts of SPEC section 6, with each connection's serial) and
replaces this node's rows of those people in ``bothy.presence`` with one
statement. No frame waits for the database and nothing is written per frame.
The same statement tells the node of an older connection of a device that
went live here to close it (4017; :func:`bothy_notify.store.cluster.publish_presence`).

A session that needs its focus to be in effect on every node awaits
:meth:`SharedPresencePublisher.wait_published` before it answers
``focus.ack``: it returns once a write has covered every change made before
the call (bounded by ``cluster.node_timeout``, past which this node counts as
gone anyway).

Failures: a write that fails gives its people back and is tried again after
:data:`RETRY_AFTER`. Every write is bounded (``database.response_timeout``, after
the gateway pool's wait for a connection): a frozen server fails it rather than
holding it, and :attr:`SharedPresencePublisher.healthy` is false from a failed
write until one succeeds (``/readyz``'s ``presence`` check: a node whose
desktops' presence cannot reach the database is not ready).

A write that finds this node's registry row missing (the node was taken for
gone, or the database lost its unlogged tables) writes nothing; the registry
puts the row back at its next heartbeat and calls
:meth:`SharedPresencePublisher.publish_all`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from functools import partial

import trio

from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store import cluster
from bothy_notify.store.db import Conn, Database, StoreError, StoreUnavailable
from gateway.hub import Hub

log = logging.getLogger("bothy.gateway.shared_presence")

PUBLISH_INTERVAL = 0.025
"""Seconds between the starts of two writes: at most 40 writes a second per node
however fast focus changes, and a focus takes effect on other nodes within about
this plus one write."""
RETRY_AFTER = 0.5
"""Seconds before a failed write is tried again (the database is away)."""


class SharedPresencePublisher:
    """Writes this node's presence facts to ``bothy.presence`` in batches.

    Args:
        hub: this node's connections (watched; read with :meth:`Hub.presence`).
        db: the pool (writes run in its worker threads).
        node_id: this node's id in the registry.
        clock: the injected clock (``updated_at`` of the rows: the newest row of
            a device wins when it is live on two nodes at once).
        metrics: ``bothy_cluster_presence_writes_total``, ``_rows_total`` and
            ``_cpu_seconds_total``.
        wait_limit: longest :meth:`wait_published` in seconds (``cluster.node_timeout``).
    """

    def __init__(
        self,
        *,
        hub: Hub,
        db: Database,
        node_id: str,
        clock: Clock,
        metrics: Metrics,
        wait_limit: float,
    ) -> None:
        self._hub = hub
        self._db = db
        self._node_id = node_id
        self._clock = clock
        self._metrics = metrics
        self._wait_limit = wait_limit
        self._people: set[str] = set()
        self._everyone = True  # the first write replaces whatever an earlier run left
        self._wake = trio.Event()
        self._wake.set()
        self._version = 0
        self._written = 0
        self._batches = 0
        self._progress = trio.Event()
        self._failing = False
        hub.watch_presence(self.changed)

    def __repr__(self) -> str:
        return f"SharedPresencePublisher(pending={len(self._people)})"

    def changed(self, user_id: str) -> None:
        """Note that ``user_id``'s presence may have changed (the hub's watcher)."""
        self._people.add(user_id)
        self._version += 1
        self._wake.set()

    def publish_all(self) -> None:
        """Write every person's presence again at the next write (the rows were lost)."""
        self._everyone = True
        self._version += 1
        self._wake.set()

    @property
    def healthy(self) -> bool:
        """False from a write that failed (the database did not take it) until a write
        succeeds (``/readyz``)."""
        return not self._failing

    def statistics(self) -> dict[str, int]:
        """Changes noted, changes written, people waiting, and batches tried (whether
        they could write or not) so far (tests, benchmarks)."""
        return {
            "changes": self._version,
            "written": self._written,
            "pending": len(self._people),
            "batches": self._batches,
        }

    async def wait_published(self) -> None:
        """Return once every change noted before this call is written.

        Returns after ``wait_limit`` seconds at most (the database is away).
        Cancellation: returns nothing early.
        """
        target = self._version
        with trio.move_on_after(self._wait_limit):
            while self._written < target:
                await self._progress.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches until cancelled. A write in progress finishes first (never
        abandoned); changes not yet written are dropped with the node's rows by the
        registry when it leaves.

        Every run starts by writing every connection's presence: after a failure
        (the gateway supervises this) the batch that failed is not lost.
        """
        self.publish_all()
        task_status.started()
        last_write = -PUBLISH_INTERVAL
        while True:
            await self._wake.wait()
            pause = last_write + PUBLISH_INTERVAL - time.monotonic()
            if pause > 0:
                await trio.sleep(pause)
            last_write = time.monotonic()
            self._wake = trio.Event()
            version, everyone, people = self._version, self._everyone, self._people
            self._people, self._everyone = set(), False
            try:
                stored = await self._db.run(
                    partial(self._write, people=None if everyone else people),
                    transaction=False,  # one statement
                )
            except StoreError as exc:
                self._batches += 1
                if not self._failing:
                    log.warning("could not publish presence; retrying")
                self._failing = True
                self._people |= people
                self._everyone |= everyone
                self._wake.set()
                if isinstance(exc, StoreUnavailable):
                    # Again as soon as another statement of the pool gets through.
                    await self._db.answer_after(trio.current_time(), RETRY_AFTER)
                else:
                    await trio.sleep(RETRY_AFTER)
                continue
            self._batches += 1
            if self._failing:
                log.info("presence is published again")
            self._failing = False
            if not stored:
                # Not in the registry right now: the registry's next heartbeat puts
                # the row back and asks for everything (publish_all).
                self._everyone = True
                continue
            self._written = version
            progress, self._progress = self._progress, trio.Event()
            progress.set()

    def _write(self, conn: Conn, *, people: Collection[str] | None) -> bool:
        """One batch: one statement (a worker thread). Blocking."""
        started = time.thread_time()
        entries = self._hub.shared_presence(self._hub.user_ids() if people is None else people)
        stored = cluster.publish_presence(
            conn, node_id=self._node_id, people=people, entries=entries, now=self._clock.now()
        )
        if stored:
            self._metrics.presence_writes.inc()
            self._metrics.presence_rows.inc(len(entries))
        self._metrics.presence_cpu_seconds.inc(time.thread_time() - started)
        return stored


__all__ = ["PUBLISH_INTERVAL", "RETRY_AFTER", "SharedPresencePublisher"]
