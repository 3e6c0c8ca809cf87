"""Aggregates for the operator's status page (``GET /v1/admin/status``).

Every read here returns counts by closed label sets (job kind and state,
provider and registration state, event type) and times, never a person,
device, thread, token or URL. The nodes' own aggregates come from
``bothy.nodes.stats`` (migration ``0019_node_stats``), which each node writes
with its heartbeat (:func:`bothy_notify.store.cluster.heartbeat`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.store.db import Conn


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A live node of the registry and the aggregates it wrote last."""

    node_id: str
    role: str
    started_at: datetime
    seen_at: datetime
    stats: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class JobGroup:
    """Unfinished jobs of one kind in one state.

    Attributes:
        due: of ``count``, those whose time has come (``available`` only).
        oldest_due_at: the scheduled time of the oldest due one (``None``: none due).
    """

    kind: str
    state: str
    count: int
    due: int
    oldest_due_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeadLetterTypes:
    """Dead letters: how many, the newest, and per type (newest first)."""

    count: int
    newest_at: datetime | None
    types: list[tuple[str, int, datetime]]


def nodes(conn: Conn, *, since: datetime) -> list[NodeStatus]:
    """Every node whose last heartbeat is at or after ``since``, oldest first."""
    rows = conn.execute(
        "SELECT node_id::text, role, started_at, seen_at, stats FROM bothy.nodes"
        " WHERE seen_at >= %s ORDER BY started_at, node_id",
        (since,),
    ).fetchall()
    return [NodeStatus(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def jobs(conn: Conn, *, now: datetime) -> list[JobGroup]:
    """Unfinished jobs by kind and state (finished ones are only kept for a while)."""
    rows = conn.execute(
        "SELECT kind, state, count(*),"
        " count(*) FILTER (WHERE state = 'available' AND scheduled_at <= %(now)s),"
        " min(scheduled_at) FILTER (WHERE state = 'available' AND scheduled_at <= %(now)s)"
        " FROM bothy.jobs WHERE state IN ('available', 'running')"
        " GROUP BY kind, state ORDER BY kind, state",
        {"now": now},
    ).fetchall()
    return [JobGroup(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in rows]


def registrations(conn: Conn) -> list[tuple[str, str, int]]:
    """(provider, ``active`` or ``invalidated``, count), sorted."""
    rows = conn.execute(
        "SELECT provider, CASE WHEN invalidated_at IS NULL THEN 'active' ELSE 'invalidated' END"
        " AS state, count(*) FROM bothy.push_registrations GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def dead_letters(conn: Conn, *, types: int = 10) -> DeadLetterTypes:
    """How many dead letters there are, and the ``types`` newest types with their counts."""
    row = conn.execute("SELECT count(*), max(dead_lettered_at) FROM bothy.dead_letters").fetchone()
    assert row is not None
    by_type = conn.execute(
        "SELECT type, count(*), max(dead_lettered_at) FROM bothy.dead_letters"
        " GROUP BY type ORDER BY max(dead_lettered_at) DESC, type LIMIT %s",
        (types,),
    ).fetchall()
    return DeadLetterTypes(int(row[0]), row[1], [(str(t), int(n), at) for t, n, at in by_type])


def dead_letter_seqs(conn: Conn, *, event_type: str | None, limit: int) -> list[int]:
    """The seqs of up to ``limit`` dead letters (of ``event_type``, else all), in log order."""
    rows = conn.execute(
        "SELECT seq FROM bothy.dead_letters WHERE %(type)s::text IS NULL OR type = %(type)s"
        " ORDER BY xid, seq LIMIT %(limit)s",
        {"type": event_type, "limit": limit},
    ).fetchall()
    return [int(r[0]) for r in rows]


def count_dead_letters(conn: Conn, *, event_type: str | None) -> int:
    row = conn.execute(
        "SELECT count(*) FROM bothy.dead_letters WHERE %(type)s::text IS NULL OR type = %(type)s",
        {"type": event_type},
    ).fetchone()
    return int(row[0]) if row else 0


def discard_dead_letters(conn: Conn, seqs: Sequence[int]) -> int:
    """Delete these dead letters (their events stay in the log); how many were deleted."""
    return int(
        conn.execute("DELETE FROM bothy.dead_letters WHERE seq = ANY(%s)", (list(seqs),)).rowcount
    )
