"""The node registry of a cluster (``cluster.mode = "multi"``).

Every node of a cluster, whatever its role, is one :class:`NodeRegistry`:

- its id is a new UUIDv7 at every process start (a restarted node is a new
  node; ``server.processes`` runs several nodes from one command);
- every ``server.heartbeat`` it writes its row's ``seen_at`` in
  ``bothy.nodes``, reads which nodes are live (gauge ``bothy_cluster_nodes``,
  ``/readyz``), and sweeps what gone nodes left: their rows, their presence,
  and the jobs targeted at them, which end as ``node_gone``
  (:func:`bothy_notify.store.cluster.sweep`; every node sweeps, the updates
  are idempotent);
- a node is gone once its last heartbeat is older than
  ``cluster.node_timeout``; the decision ignores a gone node's presence at
  once, whether or not its rows were swept yet;
- a node that could not beat itself for a while (a heartbeat failed, or its
  last one is older than ``cluster.node_timeout``: the database was away, a
  failover), or that found its own row gone after its first beat (swept, or
  the table emptied: ``bothy.nodes`` is unlogged, and a promoted replica, or a
  server restarted after a crash, starts it empty), sweeps nobody until it has
  beaten again for ``cluster.node_timeout``: the others could not beat either,
  or their rows are gone with its own, and are given that long to write them
  again, so their running jobs are not ended ``node_gone`` under them (the
  results they then record would be dropped as ``lost_lease``);
- when its row had to be inserted again (it was taken for gone, or the
  database lost its unlogged tables), it asks its gateway to publish all its
  presence again (``on_rejoin``);
- at a graceful stop it leaves: row, presence and targeted jobs go at once.

A node whose heartbeat fails keeps serving and says so: ``/readyz`` turns 503
(check ``cluster``) once its last good heartbeat is older than
``cluster.node_timeout``, since the other nodes take it for gone by then.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import trio

from bothy_notify.config import Config, Role
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import SkipReason
from bothy_notify.kernel.supervise import Supervised
from bothy_notify.store import cluster
from bothy_notify.store.cluster import NodeRow, SweepResult
from bothy_notify.store.db import Conn, Database, StoreError

log = logging.getLogger("bothy.cluster")

LEAVE_TIMEOUT = 5.0
"""Seconds a graceful stop may spend removing this node's rows; past it, the other
nodes remove them after ``cluster.node_timeout``."""


class NodeRegistry:
    """This node's membership in the cluster: heartbeat, view of the others, sweeping.

    Args:
        db: the pool.
        clock: the injected clock (heartbeat times and the live cut-off).
        config: ``server.heartbeat``, ``cluster.node_timeout``, ``server.role``.
        metrics: ``bothy_cluster_nodes{role}``, heartbeat failures, ``node_gone`` skips.
        node_id: this node's UUIDv7.
        on_rejoin: called (Trio thread) when this node's row had to be inserted
            again after its first beat: its shared presence must be published again.
        stats: this node's aggregates for the status page (JSON bytes), written
            with every heartbeat; called on the Trio thread.
    """

    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        config: Config,
        metrics: Metrics,
        node_id: str,
        on_rejoin: Callable[[], None] | None = None,
        stats: Callable[[], bytes] | None = None,
    ) -> None:
        self._db = db
        self._clock = clock
        self._metrics = metrics
        self._role = config.server.role
        self._heartbeat = config.server.heartbeat.total_seconds()
        self._timeout = config.cluster.node_timeout
        self.node_id = node_id
        self.on_rejoin = on_rejoin
        self._stats = stats
        self._started_at = clock.now()
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._beats = 0
        self._last_ok: float | None = None
        self._last_beat: datetime | None = None
        """When (this node's clock) its last heartbeat succeeded."""
        self._beat_failed = False
        self._sweeps_from: datetime | None = None
        """No sweeping before this: the grace after this node could not beat."""
        self.nodes: tuple[NodeRow, ...] = ()
        """The live nodes as of the last heartbeat, this one included."""
        self._beating = Supervised("registry", self._beat_forever, metrics=metrics)

    def __repr__(self) -> str:
        return f"NodeRegistry(role={self._role.value!r}, nodes={len(self.nodes)})"

    def healthy(self) -> bool:
        """Whether the last good heartbeat is recent enough for the others to count this node."""
        return (
            self._last_ok is not None
            and time.monotonic() - self._last_ok < self._timeout.total_seconds()
        )

    def status(self) -> Mapping[str, Any]:
        """What this node sees, for ``/readyz``: its id and the live nodes with their roles."""
        return {
            "node_id": self.node_id,
            "nodes": [{"node_id": n.node_id, "role": n.role} for n in self.nodes],
        }

    async def beat(self) -> SweepResult:
        """One heartbeat: write this node's row, sweep gone nodes (not during the grace
        after this node could not beat: see the module docstring), read the live ones.

        Raises :class:`StoreError` when the database cannot be reached.
        """
        now = self._clock.now()
        since = now - self._timeout
        stats = self._stats() if self._stats is not None else None
        last = self._last_beat
        if self._beat_failed or (last is not None and now - last > self._timeout):
            # The database was away (or this node was): the others could not beat
            # either. Give them node_timeout from now to be seen again.
            self._sweeps_from = now + self._timeout
        sweeps = self._sweeps_from is None or now >= self._sweeps_from
        first = self._beats == 0
        try:
            joined, swept, nodes = await self._db.run(
                lambda c: self._beat(c, now, since, stats, sweeps=sweeps, first=first),
                transaction=False,
            )
        except StoreError:
            self._beat_failed = True
            raise
        self._beat_failed = False
        self._last_beat = now
        if joined and not first:
            # Its row was gone: swept, or the table emptied (a promoted replica starts
            # its unlogged tables empty). The others' rows are likely gone too.
            self._sweeps_from = now + self._timeout
        self._beats += 1
        self._last_ok = time.monotonic()
        self.nodes = tuple(nodes)
        counts = dict.fromkeys((r.value for r in Role), 0)
        for node in nodes:
            counts[node.role] = counts.get(node.role, 0) + 1
        for role, n in counts.items():
            self._metrics.cluster_nodes.labels(role).set(n)
        if joined and not first:
            log.warning("this node was taken for gone; it joined again and republishes")
            if self.on_rejoin is not None:
                self.on_rejoin()
        self._count(swept)
        if swept.nodes:
            log.info("gone nodes removed", extra={"nodes": swept.nodes})
        return swept

    def _beat(
        self,
        conn: Conn,
        now: datetime,
        since: datetime,
        stats: bytes | None = None,
        *,
        sweeps: bool = True,
        first: bool = True,
    ) -> tuple[bool, SweepResult, list[NodeRow]]:
        # The heartbeat commits on its own first: a transaction that held this node's
        # row while it swept other nodes' rows could deadlock with another node doing
        # the same after both were late (each taking the other for gone).
        joined = cluster.heartbeat(
            conn,
            node_id=self.node_id,
            role=self._role.value,
            host=self._host,
            pid=self._pid,
            started_at=self._started_at,
            now=now,
            stats=stats,
        )
        if not sweeps or (joined and not first):
            return joined, SweepResult(0, 0, {}), cluster.live_nodes(conn, since=since)
        with conn.transaction():
            swept = cluster.sweep(conn, since=since, now=now)
            nodes = cluster.live_nodes(conn, since=since)
        return joined, swept, nodes

    def _count(self, result: SweepResult) -> None:
        for kind, n in result.jobs_gone.items():
            self._metrics.skip(SkipReason.NODE_GONE, n)
            self._metrics.jobs_finished.labels(kind, SkipReason.NODE_GONE.result).inc(n)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join (first heartbeat), then beat every ``server.heartbeat`` until cancelled.

        ``task_status.started()`` is called once this node's row is written, so
        a gateway started after it can publish presence at once. Raises
        :class:`StoreError` when the first heartbeat fails. Cancellation: this
        node leaves the registry in a shielded cleanup (bounded by
        :data:`LEAVE_TIMEOUT`).
        """
        try:
            await self.beat()
            log.info("node joined the cluster", extra={"nodes": len(self.nodes)})
            task_status.started()
            # Any other failure of a heartbeat (a bug, a callback that raised) restarts
            # the loop with backoff instead of stopping the node; ``healthy`` (the
            # ``cluster`` check of /readyz) turns false only if beats stop for long.
            await self._beating.run()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(LEAVE_TIMEOUT):
                await self.leave()

    async def _beat_forever(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            await trio.sleep(self._heartbeat)
            try:
                await self.beat()
            except StoreError:
                self._metrics.cluster_heartbeat_failures.inc()
                log.warning("heartbeat failed; retrying at the next one")

    async def leave(self) -> None:
        """Remove this node's row and presence, and end jobs waiting for it (``node_gone``)."""
        if self._beats == 0:
            return
        now = self._clock.now()
        try:
            result = await self._db.run(lambda c: cluster.leave(c, node_id=self.node_id, now=now))
        except StoreError:
            log.warning("could not leave the registry; the other nodes will time this node out")
            return
        self._count(result)
        self._beats = 0
        self._last_ok = None
        log.info("node left the cluster")


__all__ = ["LEAVE_TIMEOUT", "NodeRegistry"]
