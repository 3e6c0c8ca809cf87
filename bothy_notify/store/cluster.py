"""The node registry and the shared presence table (``cluster.mode = "multi"``).

Tables (migration ``0009_cluster``, both UNLOGGED):

- ``bothy.nodes``: one row per running node process, its heartbeat
  (``seen_at``) written every ``server.heartbeat``. A node is *live* while its
  ``seen_at`` is at or after ``now - cluster.node_timeout``; after that it is
  *gone*, and any node's :func:`sweep` removes it.
- ``bothy.presence``: the presence facts (SPEC section 6) of every live
  connection, one row per (person, device, node), written by the node that
  holds the connection (:func:`publish_presence`), with two numbers that are
  no fact of the person (migration ``0011_presence_replacement``): the
  holding node's serial of the connection, and ``live_seq``, which orders the
  connections of one device across nodes.

A device holds one connection in a cluster as on one node (SPEC section 8.6):
a presence write that finds a row of the same device on another node with a
lower ``live_seq`` (an older connection, still open there) sends
``pg_notify(REPLACED_CHANNEL, '{"node_id", "user_id", "device_id", "serial"}')``
for it in the same statement, and that node closes exactly that connection
with 4017 (:mod:`gateway.revocations`). A listener that was away asks
:func:`replaced_here` instead.

Times are the injected clock's, like the job queue's, so every node of a
cluster must keep its clock in step (NTP) to well within
``cluster.node_timeout``.

Why no row of a gone node survives (the race between a node's presence write
and another node's sweep): a presence write takes its node row ``FOR SHARE``
in the same statement; the sweep deletes node rows first, waiting for such
writes to commit, and their presence rows in a second statement, which sees
what they wrote. A write that starts after the node row is gone finds nothing
to lock and writes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.store.db import Conn

NODE_GONE = "node_gone"
"""``last_error`` of a job that ended because the node it was for is gone."""
REPLACED_CHANNEL = "bothy_device_replaced"
"""``NOTIFY`` channel: a device's older connection on the named node is replaced."""


@dataclass(frozen=True, slots=True)
class NodeRow:
    """A live node as the registry shows it (``/readyz``, the gauge).

    Attributes:
        node_id: the node's UUIDv7 (new at every process start).
        role: ``all``, ``worker`` or ``api``.
        seen_at: its last heartbeat, on its own clock.
    """

    node_id: str
    role: str
    seen_at: datetime


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one :func:`sweep` removed.

    Attributes:
        nodes: node rows of gone nodes deleted.
        presence: their presence rows deleted.
        jobs_gone: jobs targeted at gone nodes ended, by kind.
    """

    nodes: int
    presence: int
    jobs_gone: dict[str, int]


def heartbeat(
    conn: Conn,
    *,
    node_id: str,
    role: str,
    host: str,
    pid: int,
    started_at: datetime,
    now: datetime,
    stats: bytes | None = None,
) -> bool:
    """Write this node's heartbeat; returns whether its row had to be inserted.

    One statement: run it on its own (autocommit), never inside a transaction
    that goes on to :func:`sweep` (two late nodes sweeping each other could
    deadlock).

    ``stats``: the node's aggregates for the status page (JSON, see
    :mod:`bothy_notify.store.status`), written with every beat.

    ``True`` at the first beat, and whenever the row was missing (another node
    took this one for gone and removed it, or the database lost its unlogged
    tables in a crash): the node's presence rows are gone too then, and its
    gateway must publish everything again.
    """
    row = conn.execute(
        "INSERT INTO bothy.nodes (node_id, role, host, pid, started_at, seen_at, stats)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb)"
        " ON CONFLICT (node_id) DO UPDATE SET seen_at = EXCLUDED.seen_at,"
        " stats = EXCLUDED.stats"
        " RETURNING xmax = 0",  # xmax is 0 on a row this statement inserted
        (node_id, role, host, pid, started_at, now, stats.decode() if stats else None),
    ).fetchone()
    return bool(row and row[0])


def live_nodes(conn: Conn, *, since: datetime) -> list[NodeRow]:
    """Every node whose last heartbeat is at or after ``since``, oldest first."""
    rows = conn.execute(
        "SELECT node_id::text, role, seen_at FROM bothy.nodes WHERE seen_at >= %s"
        " ORDER BY started_at, node_id",
        (since,),
    ).fetchall()
    return [NodeRow(r[0], r[1], r[2]) for r in rows]


def sweep(conn: Conn, *, since: datetime, now: datetime) -> SweepResult:
    """Remove gone nodes and their presence; end the jobs targeted at them.

    Call inside a transaction (the two deletes belong together, see the module
    docstring). A job for a node that is not live (its row is old or missing)
    can run nowhere else: it ends ``completed`` with ``last_error =
    'node_gone'``, whether it waited or was claimed by that node.
    """
    gone = [
        str(r[0])
        for r in conn.execute(
            "DELETE FROM bothy.nodes WHERE seen_at < %s RETURNING node_id", (since,)
        ).fetchall()
    ]
    presence = 0
    if gone:
        presence = conn.execute(
            "DELETE FROM bothy.presence WHERE node_id = ANY(%s::uuid[])", (gone,)
        ).rowcount
    ended = conn.execute(
        "WITH ended AS (UPDATE bothy.jobs j SET state = 'completed', finished_at = %s,"
        "  lease_until = NULL, last_error = %s"
        " WHERE j.node_id IS NOT NULL AND j.state IN ('available', 'running')"
        "  AND NOT EXISTS (SELECT 1 FROM bothy.nodes n"
        "   WHERE n.node_id = j.node_id AND n.seen_at >= %s)"
        " RETURNING j.kind) SELECT kind, count(*) FROM ended GROUP BY kind",
        (now, NODE_GONE, since),
    ).fetchall()
    return SweepResult(len(gone), presence, {str(k): int(n) for k, n in ended})


def leave(conn: Conn, *, node_id: str, now: datetime) -> SweepResult:
    """This node stops (a graceful shutdown): its row, its presence, its jobs.

    Jobs still targeted at it end as ``node_gone`` at once, so nobody waits
    for ``cluster.node_timeout``.
    """
    nodes = conn.execute("DELETE FROM bothy.nodes WHERE node_id = %s", (node_id,)).rowcount
    presence = conn.execute("DELETE FROM bothy.presence WHERE node_id = %s", (node_id,)).rowcount
    ended = conn.execute(
        "WITH ended AS (UPDATE bothy.jobs SET state = 'completed', finished_at = %s,"
        "  lease_until = NULL, last_error = %s"
        " WHERE node_id = %s AND state IN ('available', 'running') RETURNING kind)"
        " SELECT kind, count(*) FROM ended GROUP BY kind",
        (now, NODE_GONE, node_id),
    ).fetchall()
    return SweepResult(nodes, presence, {str(k): int(n) for k, n in ended})


PresenceRows = Sequence[tuple[str, PresenceEntry, int]]
"""(person, entry, connection serial) of one node, at most one per (person, device)."""


_PUBLISH = (
    "WITH me AS (SELECT node_id FROM bothy.nodes WHERE node_id = %(node)s FOR SHARE),"
    " fresh AS (SELECT r.u, r.d, r.p, ARRAY(SELECT jsonb_array_elements_text(r.f)) AS f, r.i,"
    "  r.s FROM jsonb_to_recordset(%(rows)s::jsonb)"
    "  AS r(u text, d text, p text, f jsonb, i boolean, s bigint)),"
    " stale AS (DELETE FROM bothy.presence o USING me WHERE o.node_id = me.node_id"
    "  AND (%(everyone)s OR o.user_id = ANY(%(people)s))"
    "  AND NOT EXISTS (SELECT 1 FROM fresh WHERE fresh.u = o.user_id AND fresh.d = o.device_id)),"
    " upsert AS (INSERT INTO bothy.presence AS o"
    "  (user_id, device_id, node_id, platform, focus, idle, updated_at, conn_serial, live_seq)"
    "  SELECT fresh.u, fresh.d, me.node_id, fresh.p, fresh.f, fresh.i, %(now)s, fresh.s,"
    "   nextval('bothy.presence_live_seq') FROM fresh, me"
    "  ON CONFLICT (user_id, device_id, node_id) DO UPDATE SET platform = EXCLUDED.platform,"
    "  focus = EXCLUDED.focus, idle = EXCLUDED.idle, updated_at = EXCLUDED.updated_at,"
    "  conn_serial = EXCLUDED.conn_serial, live_seq = CASE"
    "   WHEN o.conn_serial = EXCLUDED.conn_serial THEN o.live_seq ELSE EXCLUDED.live_seq END"
    "  RETURNING o.user_id, o.device_id, o.node_id, o.conn_serial, o.live_seq),"
    # The older of each pair (this row, another node's row of the same device) is
    # replaced; usually the other one, this node's own when the other was written
    # later by a statement that could not see this row yet.
    " replaced AS (SELECT pg_notify(%(channel)s, json_build_object("
    "   'node_id', CASE WHEN w.live_seq < u.live_seq THEN w.node_id ELSE u.node_id END,"
    "   'user_id', w.user_id, 'device_id', w.device_id,"
    "   'serial', CASE WHEN w.live_seq < u.live_seq THEN w.conn_serial ELSE u.conn_serial END"
    "  )::text) FROM upsert u JOIN bothy.presence w ON w.user_id = u.user_id"
    "  AND w.device_id = u.device_id AND w.node_id <> u.node_id)"
    " SELECT (SELECT count(*) FROM me), (SELECT count(*) FROM replaced)"
)
"""One statement (one round trip, no transaction of its own): lock this node's
registry row, delete its rows of the changed people that are no longer live,
upsert the live ones, and tell the holder of an older connection of the same
device on another node to close it. The delete and the upsert touch different
rows; the other nodes' rows are read as they were before the statement."""


def publish_presence(
    conn: Conn,
    *,
    node_id: str,
    people: Collection[str] | None,
    entries: PresenceRows,
    now: datetime,
) -> bool:
    """Make this node's presence rows of ``people`` (``None``: of everyone) equal
    ``entries``. One statement; may run outside a transaction.

    Returns ``False`` and writes nothing when this node has no row in
    ``bothy.nodes`` (it was taken for gone): the caller publishes everything
    again once its heartbeat has put the row back.
    """
    rows = orjson.dumps(
        [
            {
                "u": user,
                "d": e.device_id,
                "p": e.platform,
                "f": sorted(e.focus),
                "i": e.idle,
                "s": serial,
            }
            for user, e, serial in entries
        ]
    ).decode()
    row = conn.execute(
        _PUBLISH,
        {
            "node": node_id,
            "rows": rows,
            "everyone": people is None,
            "people": list(people or ()),
            "now": now,
            "channel": REPLACED_CHANNEL,
        },
    ).fetchone()
    return bool(row and row[0])


def replaced_here(conn: Conn, *, node_id: str) -> list[tuple[str, str, int]]:
    """(person, device, connection serial) of this node's connections that another
    node holds a newer connection of: what the notifications of
    :data:`REPLACED_CHANNEL` said while this node was not listening."""
    rows = conn.execute(
        "SELECT o.user_id, o.device_id, o.conn_serial FROM bothy.presence o"
        " WHERE o.node_id = %s AND EXISTS (SELECT 1 FROM bothy.presence n"
        "  WHERE n.user_id = o.user_id AND n.device_id = o.device_id"
        "  AND n.node_id <> o.node_id AND n.live_seq > o.live_seq)",
        (node_id,),
    ).fetchall()
    return [(str(u), str(d), int(s)) for u, d, s in rows]


__all__ = [
    "NODE_GONE",
    "REPLACED_CHANNEL",
    "NodeRow",
    "PresenceRows",
    "SweepResult",
    "heartbeat",
    "leave",
    "live_nodes",
    "publish_presence",
    "replaced_here",
    "sweep",
]
