"""The reads and writes the gateway makes, each run inside one ``Database.run`` call.

They reuse the store's functions where one exists (``ensure_device``,
``mark_read``), so the gateway and the HTTP API give every fact one meaning.
Read access has the meaning of ``bothy_notify.store.facts.has_access`` (a
membership names the thread, its channel or its space); it is spelled out here
because ``store.facts`` builds the decision's values and imports
``bothy_notify.notify``, which the gateway never imports.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bothy_notify.auth import DeviceClaims
from bothy_notify.store import registrations
from bothy_notify.store.db import Conn

_READABLE = (
    "EXISTS (SELECT 1 FROM bothy.members m WHERE m.user_id = %(user)s"
    " AND m.scope_id IN (t.thread_id, t.channel_id, t.space_id))"
)
"""A person may read a thread when a membership names the thread, its channel or its space."""


def identify(conn: Conn, *, claims: DeviceClaims) -> tuple[str, list[tuple[str, int]]]:
    """Create or update the device row from the claims; the unread snapshot.

    Returns the device's state (``revoked`` means refuse) and, unless revoked,
    the person's followed, readable threads with unread messages as
    ``(thread_id, unread)`` pairs.
    """
    state = registrations.ensure_device(
        conn,
        user_id=claims.user_id,
        device_id=claims.device_id,
        platform=claims.platform,
        principal_kind=claims.kind,
    )
    if state == "revoked":
        return state, []
    return state, unread_threads(conn, claims.user_id)


def unread_threads(conn: Conn, user_id: str) -> list[tuple[str, int]]:
    """Followed (level ``all`` or ``mentions``), readable threads with unread messages.

    ``unread`` is ``last_message_seq - max(last_read_seq, unread_floor_seq)``.
    """
    rows = conn.execute(
        "SELECT t.thread_id, t.last_message_seq"
        "  - greatest(coalesce(r.last_read_seq, 0), t.unread_floor_seq)"
        " FROM bothy.follows f JOIN bothy.threads t ON t.thread_id = f.thread_id"
        " LEFT JOIN bothy.read_states r ON r.user_id = f.user_id AND r.thread_id = f.thread_id"
        " WHERE f.user_id = %(user)s AND f.level <> 'none'"
        "   AND t.last_message_seq > greatest(coalesce(r.last_read_seq, 0), t.unread_floor_seq)"
        f"  AND {_READABLE}"
        " ORDER BY t.thread_id",
        {"user": user_id},
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def readable_threads(conn: Conn, *, user_id: str, thread_ids: Sequence[str]) -> list[str]:
    """The threads among ``thread_ids`` that ``user_id`` may read now, in the given order."""
    if not thread_ids:
        return []
    rows = conn.execute(
        f"SELECT t.thread_id FROM bothy.threads t WHERE t.thread_id = ANY(%(ids)s) AND {_READABLE}",
        {"user": user_id, "ids": list(thread_ids)},
    ).fetchall()
    readable = {r[0] for r in rows}
    return [t for t in thread_ids if t in readable]


def may_read(conn: Conn, *, user_id: str, thread_id: str) -> bool:
    """Whether ``user_id`` may read ``thread_id`` now (an unknown thread: no)."""
    row = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM bothy.threads t WHERE t.thread_id = %(thread)s"
        f" AND {_READABLE})",
        {"user": user_id, "thread": thread_id},
    ).fetchone()
    return bool(row and row[0])


def revoked_among(conn: Conn, device_ids: Collection[str]) -> set[str]:
    """The devices among ``device_ids`` whose state is ``revoked``."""
    if not device_ids:
        return set()
    rows = conn.execute(
        "SELECT device_id FROM bothy.devices WHERE state = 'revoked' AND device_id = ANY(%s)",
        (list(device_ids),),
    ).fetchall()
    return {str(r[0]) for r in rows}
