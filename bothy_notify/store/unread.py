"""Unread threads: the set the gateway's ``unread`` op lists, and its size (the badge).

A thread is unread for a person when they follow it (level ``all`` or
``mentions``), may read it now, and its ``last_message_seq`` is past their read
position ``max(last_read_seq, unread_floor_seq)`` (:mod:`bothy_notify.store.access`).
``unread`` is the difference. The ``unread`` op, ``GET /v1/notifications/unread``
and every push's ``badge`` mean exactly this set, so a phone's badge, a desktop's
list and the app's own call never disagree.

Each read is one statement for any number of people, reaching ``follows`` per
person by its key (a fenced LATERAL, see :mod:`bothy_notify.notify.facts` on the
forms; ``tests/notify/test_read_plans.py``).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

from bothy_notify.store.access import readable_by
from bothy_notify.store.db import Conn

UNREAD_LISTING_MAX = 1000
"""``GET /v1/notifications/unread`` lists at most this many threads (``truncated`` beyond)."""

# Per person, inside a fenced LATERAL (OFFSET 0): their follows by key, each joined
# to its thread and read state by key, so no plan joins a whole table to the list.
_PER_PERSON = (
    "  SELECT t.thread_id, t.last_message_seq,"
    "   greatest(coalesce(r.last_read_seq, 0), t.unread_floor_seq) AS position"
    "  FROM bothy.follows f"
    "  JOIN bothy.threads t ON t.thread_id = f.thread_id"
    "  LEFT JOIN bothy.read_states r ON r.user_id = f.user_id AND r.thread_id = f.thread_id"
    "  WHERE f.user_id = k.id AND f.level <> 'none'"
    "   AND t.last_message_seq > greatest(coalesce(r.last_read_seq, 0), t.unread_floor_seq)"
    f"   AND {readable_by('f.user_id')}"
)
_UNREAD = (
    "SELECT k.id, u.thread_id, u.last_message_seq, u.position"
    " FROM json_array_elements_text(%(users)s::json) AS k(id) CROSS JOIN LATERAL ("
    f"{_PER_PERSON} OFFSET 0) u"
    " ORDER BY k.id, u.thread_id"
)
_LISTING = (
    "SELECT b.n, l.thread_id, l.last_message_seq, l.position"
    " FROM (SELECT %(user)s::text AS id) AS k"
    f" CROSS JOIN LATERAL (SELECT count(*) AS n FROM ({_PER_PERSON}) p) b"
    f" LEFT JOIN LATERAL ({_PER_PERSON} ORDER BY t.thread_id LIMIT %(limit)s) l ON true"
    " ORDER BY l.thread_id"
)
_BADGES = (
    "SELECT k.id, u.n"
    " FROM json_array_elements_text(%(users)s::json) AS k(id) CROSS JOIN LATERAL ("
    f"  SELECT count(*) AS n FROM ({_PER_PERSON}) p) u"
)


@dataclass(frozen=True, slots=True)
class UnreadThread:
    """One unread thread of a person: its id, how many messages are unread, and the
    person's read position on it."""

    thread_id: str
    unread: int
    last_read_seq: int

    def __repr__(self) -> str:
        return f"UnreadThread(unread={self.unread})"


def unread_of(conn: Conn, user_ids: Collection[str]) -> dict[str, list[UnreadThread]]:
    """The unread threads of each person in ``user_ids`` (one statement), ordered by
    thread id; a person without any is absent."""
    if not user_ids:
        return {}
    rows = conn.execute(_UNREAD, {"users": json.dumps(sorted(set(user_ids)))}).fetchall()
    out: dict[str, list[UnreadThread]] = {}
    for user_id, thread_id, last_message_seq, position in rows:
        out.setdefault(str(user_id), []).append(
            UnreadThread(str(thread_id), int(last_message_seq) - int(position), int(position))
        )
    return out


def unread_listing(conn: Conn, user_id: str, limit: int) -> tuple[int, list[UnreadThread]]:
    """The badge of ``user_id`` (how many threads are unread, counted in SQL) and the
    first ``limit`` of those threads by thread id (cut in SQL: a person with many
    unread threads costs a count, never a row each), in one statement."""
    rows = conn.execute(_LISTING, {"user": user_id, "limit": limit}).fetchall()
    badge = int(rows[0][0]) if rows else 0
    return badge, [
        UnreadThread(str(thread_id), int(last_message_seq) - int(position), int(position))
        for _n, thread_id, last_message_seq, position in rows
        if thread_id is not None
    ]


def unread_threads_of(conn: Conn, user_ids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
    """The ``unread`` op's ``(thread_id, unread)`` pairs of each person (one statement)."""
    return {
        user_id: [(t.thread_id, t.unread) for t in threads]
        for user_id, threads in unread_of(conn, user_ids).items()
    }


def badges_of(conn: Conn, user_ids: Collection[str]) -> dict[str, int]:
    """The badge of each person in ``user_ids``: how many threads are unread (one
    statement for all of them; a person with none has 0)."""
    if not user_ids:
        return {}
    rows = conn.execute(_BADGES, {"users": json.dumps(sorted(set(user_ids)))}).fetchall()
    return {str(user_id): int(n) for user_id, n in rows}


__all__ = [
    "UNREAD_LISTING_MAX",
    "UnreadThread",
    "badges_of",
    "unread_listing",
    "unread_of",
    "unread_threads_of",
]
