"""Deleted messages (``message.deleted``, issue 33): what the daemon keeps of them and
who it tells.

- :func:`record` (the round, in its transaction): the (thread, message) is recorded
  with its sequence and the time of the deletion (no text, no mentions), the
  thread's ``deleted_at`` is set, and with ``last_seq`` the thread's last message
  moves back to the newest one that remains, so unread counts and badges drop the
  deleted one. A read position never moves.
- :func:`deleted_among` (send jobs): which of their (thread, message) pairs were
  deleted; a job asks only for threads whose row says ``deleted_at`` (the row it
  reads anyway, :func:`bothy_notify.notify.facts.reach_now`), so a send in a thread
  without deletions reads nothing more.
- :func:`deleted_seqs` (a coalescing window's flush): the deleted messages of the
  thread in a range of sequences.
- :func:`tell_removed` (the round): ``NOTIFY bothy_message_removed`` with the
  thread's place and the people whose live connections get
  ``notification.removed``, in payloads under PostgreSQL's limit; sent at commit.
- :func:`prune` (housekeeping): records older than any job of their message.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.store.db import Conn

MESSAGE_REMOVED_CHANNEL = "bothy_message_removed"
"""``NOTIFY`` channel of a deleted message's desktops; the payload is JSON
``{"thread_id","message_id","space_id"?,"channel_id"?,"user_ids":[...]}`` (IDs
only), read by ``gateway.reads`` (the ``notification.removed`` frame)."""

NOTIFY_PAYLOAD_MAX = 7900
"""Bytes of one ``NOTIFY`` payload (PostgreSQL refuses 8,000 and more): a long list
of people goes in several."""


@dataclass(frozen=True, slots=True)
class ThreadPlace:
    """Where a thread is now (the ``scope`` of a frame about it)."""

    space_id: str | None
    channel_id: str | None


def record(conn: Conn, p: Mapping[str, Any], now: datetime) -> ThreadPlace | None:
    """Project ``message.deleted``: record the deletion and move the thread's last
    message back to ``last_seq`` when given (only when the deleted message was at or
    after it, so a newer message is never dropped). Returns the thread's place, or
    ``None`` for a thread the projection does not know. Idempotent."""
    thread_id, message_id, seq = p["thread_id"], p["message_id"], int(p["thread_seq"])
    last = p.get("last_seq")
    conn.execute(
        "INSERT INTO bothy.deleted_messages (thread_id, message_id, seq, deleted_at)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (thread_id, message_id) DO NOTHING",
        (thread_id, message_id, seq, now),
    )
    row = conn.execute(
        "UPDATE bothy.threads SET deleted_at = %(now)s,"
        " last_message_seq = CASE WHEN %(last)s::bigint IS NOT NULL"
        "  AND last_message_seq <= %(seq)s THEN least(last_message_seq, %(last)s::bigint)"
        "  ELSE last_message_seq END"
        " WHERE thread_id = %(thread)s RETURNING space_id, channel_id",
        {"now": now, "last": None if last is None else int(last), "seq": seq, "thread": thread_id},
    ).fetchone()
    return None if row is None else ThreadPlace(row[0], row[1])


def deleted_among(conn: Conn, keys: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (thread_id, message_id) pairs of ``keys`` that were deleted (one statement,
    each pair by its key in a fenced LATERAL: see :mod:`bothy_notify.notify.facts`
    on the forms)."""
    if not keys:
        return set()
    pairs = list(keys)
    rows = conn.execute(
        "SELECT k.t, k.m FROM ROWS FROM (json_array_elements_text(%s::json),"
        " json_array_elements_text(%s::json)) AS k(t, m)"
        " CROSS JOIN LATERAL (SELECT 1 FROM bothy.deleted_messages d"
        "  WHERE d.thread_id = k.t AND d.message_id = k.m OFFSET 0) d",
        (json.dumps([k[0] for k in pairs]), json.dumps([k[1] for k in pairs])),
    ).fetchall()
    return {(str(r[0]), str(r[1])) for r in rows}


def deleted_seqs(
    conn: Conn, thread_id: str, after: int, upto: int, *, since: datetime
) -> frozenset[int]:
    """The sequences in ``(after, upto]`` of the thread's messages deleted at or after
    ``since`` (a sequence deleted before a window opened may have been given to a
    newer message since)."""
    rows = conn.execute(
        "SELECT DISTINCT seq FROM bothy.deleted_messages"
        " WHERE thread_id = %s AND seq > %s AND seq <= %s AND deleted_at >= %s",
        (thread_id, after, upto, since),
    ).fetchall()
    return frozenset(int(r[0]) for r in rows)


def newest_deleted(conn: Conn, thread_ids: Collection[str]) -> dict[str, str]:
    """The message id of each thread's latest deletion still kept (one statement)."""
    if not thread_ids:
        return {}
    rows = conn.execute(
        "SELECT k.t, d.message_id FROM json_array_elements_text(%s::json) AS k(t)"
        " CROSS JOIN LATERAL (SELECT d.message_id FROM bothy.deleted_messages d"
        "  WHERE d.thread_id = k.t ORDER BY d.deleted_at DESC, d.seq DESC LIMIT 1) d",
        (json.dumps(sorted(set(thread_ids))),),
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def _chunks(base: dict[str, str], users: Sequence[str]) -> Iterator[str]:
    """``base`` with ``user_ids`` added, as JSON texts each under the payload limit."""
    room = NOTIFY_PAYLOAD_MAX - len(json.dumps({**base, "user_ids": []}, separators=(",", ":")))
    batch: list[str] = []
    used = 0
    for user in users:
        size = len(json.dumps(user)) + 1
        if batch and used + size > room:
            yield json.dumps({**base, "user_ids": batch}, separators=(",", ":"))
            batch, used = [], 0
        batch.append(user)
        used += size
    if batch:
        yield json.dumps({**base, "user_ids": batch}, separators=(",", ":"))


def tell_removed(
    conn: Conn,
    thread_id: str,
    message_id: str,
    place: ThreadPlace | None,
    user_ids: Collection[str],
) -> int:
    """``NOTIFY`` every gateway (at the caller's commit) that ``user_ids``' live
    connections get ``notification.removed`` for the message; returns how many
    notifications were sent."""
    if not user_ids:
        return 0
    base = {"thread_id": thread_id, "message_id": message_id}
    if place is not None and place.space_id:
        base["space_id"] = place.space_id
    if place is not None and place.channel_id:
        base["channel_id"] = place.channel_id
    sent = 0
    for payload in _chunks(base, sorted(user_ids)):
        conn.execute("SELECT pg_notify(%s, %s)", (MESSAGE_REMOVED_CHANNEL, payload))
        sent += 1
    return sent


def prune(conn: Conn, older_than: datetime) -> int:
    """Forget deletions made before ``older_than`` (no job of their message can still
    be pending); their threads' ``deleted_at`` is cleared when it is that old.
    Returns how many records went."""
    gone = conn.execute(
        "DELETE FROM bothy.deleted_messages WHERE deleted_at < %s", (older_than,)
    ).rowcount
    conn.execute(
        "UPDATE bothy.threads SET deleted_at = NULL"
        " WHERE deleted_at IS NOT NULL AND deleted_at < %s",
        (older_than,),
    )
    return gone


__all__ = [
    "MESSAGE_REMOVED_CHANNEL",
    "ThreadPlace",
    "deleted_among",
    "deleted_seqs",
    "newest_deleted",
    "prune",
    "record",
    "tell_removed",
]
