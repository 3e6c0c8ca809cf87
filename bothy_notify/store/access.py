"""Read access and read positions: the two facts every check of a hint reads.

A person may read a thread when a membership names the thread, its channel or
its space. The read position is ``max(last_read_seq, unread_floor_seq)``. The
notify jobs, the gateway and the decision's bulk loaders all mean exactly this.
"""

from __future__ import annotations

from collections.abc import Sequence

from bothy_notify.store.db import Conn


def readable_by(user: str) -> str:
    """SQL: thread ``t`` is readable by the person ``user`` (an SQL expression)."""
    return (
        f"EXISTS (SELECT 1 FROM bothy.members m WHERE m.user_id = {user}"
        " AND m.scope_id IN (t.thread_id, t.channel_id, t.space_id))"
    )


READABLE = readable_by("%(user)s")
"""SQL: thread ``t`` is readable by ``%(user)s``."""


def may_read(conn: Conn, *, user_id: str, thread_id: str) -> bool:
    """Whether ``user_id`` may read ``thread_id`` now (an unknown thread: no)."""
    row = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM bothy.threads t WHERE t.thread_id = %(thread)s"
        f" AND {READABLE})",
        {"user": user_id, "thread": thread_id},
    ).fetchone()
    return bool(row and row[0])


def readable_threads(conn: Conn, *, user_id: str, thread_ids: Sequence[str]) -> list[str]:
    """The threads among ``thread_ids`` that ``user_id`` may read now, in the given order."""
    if not thread_ids:
        return []
    rows = conn.execute(
        f"SELECT t.thread_id FROM bothy.threads t WHERE t.thread_id = ANY(%(ids)s) AND {READABLE}",
        {"user": user_id, "ids": list(thread_ids)},
    ).fetchall()
    readable = {r[0] for r in rows}
    return [t for t in thread_ids if t in readable]


def read_position(conn: Conn, user_id: str, thread_id: str) -> int:
    """``max(last_read_seq, unread_floor_seq)``; 0 when nothing is stored."""
    row = conn.execute(
        "SELECT greatest(coalesce((SELECT last_read_seq FROM bothy.read_states"
        " WHERE user_id = %s AND thread_id = %s), 0),"
        " coalesce((SELECT unread_floor_seq FROM bothy.threads WHERE thread_id = %s), 0))",
        (user_id, thread_id, thread_id),
    ).fetchone()
    return int(row[0]) if row else 0
