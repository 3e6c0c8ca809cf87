"""Push marks: which registration was delivered a push for which thread since its
previous clear (clear-on-read, issue 20).

A delivered ``notify.push_send`` for a thread marks (registration, thread) in the
transaction that records its result (:func:`record_many`). A read that moves the
person's position forward (:func:`bothy_notify.store.projections.mark_read`, the
one place every path writes it) queues one ``notify.push_clear`` per marked active
registration of the person but the reading device's (:func:`queue_clears`); the
mark's ``clear_pending`` keeps it to one queued job per (registration, thread), so
a burst of reads sends one push. The job takes the flag back when it runs
(:func:`take_pending`) and reads the position then, so its push carries the
newest; its delivery removes the mark unless a newer push marked it again
(:func:`remove_many`). Marks go with their registration (``ON DELETE CASCADE``).

A deleted message (issue 33) queues one ``notify.push_removed`` per marked active
registration of the thread, whoever's, with none pending (:func:`queue_removals`;
``removed_pending`` keeps a burst of deletions to one push); the job takes the flag
back when it runs (:func:`take_removed_pending`) and sends a ``removed`` push, or
the ``read`` clear when nothing of the thread is left unread for the person (whose
delivery removes the mark as a clear's does).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.config import PushConfig
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import JobSpec, JobWriter

PUSH_CLEAR = "notify.push_clear"
PUSH_REMOVED = "notify.push_removed"


@dataclass(frozen=True, slots=True)
class Clearing:
    """How a read queues its clears: ``now`` (the clock's), ``delay``
    (``push.clear_delay``) and the job's ``max_attempts``."""

    now: datetime
    delay: timedelta
    max_attempts: int

    def __repr__(self) -> str:
        return f"Clearing(delay={self.delay!r})"


def clearing_of(config: PushConfig, now: datetime) -> Clearing | None:
    """How a read at ``now`` queues its clears (``push.clear_on_read``,
    ``push.clear_delay``); ``None`` when clear-on-read is off."""
    if not config.clear_on_read:
        return None
    return Clearing(now, config.clear_delay, config.max_attempts)


def record_many(conn: Conn, items: list[tuple[str, str]], now: datetime) -> None:
    """Mark each delivered (registration_id, thread_id); a registration deleted
    meanwhile gets none. A pair may come more than once (two hints of a thread in
    one batch): it is written once."""
    if not items:
        return
    items = list(dict.fromkeys(items))
    conn.execute(
        "INSERT INTO bothy.push_marks (registration_id, thread_id, user_id, marked_at)"
        " SELECT r.id, k.thread_id, r.user_id, %s"
        " FROM unnest(%s::text[], %s::text[]) AS k(registration_id, thread_id)"
        " JOIN bothy.push_registrations r ON r.id = k.registration_id"
        " ON CONFLICT (registration_id, thread_id) DO UPDATE SET marked_at = EXCLUDED.marked_at",
        (now, [i[0] for i in items], [i[1] for i in items]),
    )


def queue_clears(
    conn: Conn, user_id: str, thread_id: str, clearing: Clearing, device_id: str | None
) -> int:
    """Queue one ``notify.push_clear`` per marked active registration of the person
    for the thread with none pending, but the reading device's (``device_id``;
    ``None``: unknown, the ``thread.read`` event); returns how many."""
    rows = conn.execute(
        "UPDATE bothy.push_marks m SET clear_pending = true FROM bothy.push_registrations r"
        " WHERE m.user_id = %s AND m.thread_id = %s AND NOT m.clear_pending"
        " AND r.id = m.registration_id AND r.invalidated_at IS NULL"
        " AND r.device_id IS DISTINCT FROM %s RETURNING m.registration_id",
        (user_id, thread_id, device_id),
    ).fetchall()
    if not rows:
        return 0
    writer = JobWriter(conn, clearing.now)
    at = clearing.now + clearing.delay
    for (registration_id,) in rows:
        writer.add(
            JobSpec(
                kind=PUSH_CLEAR,
                args={
                    "user_id": user_id,
                    "registration_id": str(registration_id),
                    "thread_id": thread_id,
                },
                scheduled_at=at,
                max_attempts=clearing.max_attempts,
            )
        )
    return writer.finish()


def queue_removals(conn: Conn, thread_id: str, clearing: Clearing) -> int:
    """Queue one ``notify.push_removed`` per marked active registration of the thread
    (anyone's) with none pending, ``push.clear_delay`` from now; returns how many."""
    # A popular thread has marks of thousands of registrations: each is reached by its
    # key from the thread's marks (fenced), never by a join the planner could make a
    # scan of the whole registrations table.
    rows = conn.execute(
        "WITH marked AS (SELECT m.registration_id FROM bothy.push_marks m"
        "  CROSS JOIN LATERAL (SELECT 1 FROM bothy.push_registrations r"
        "   WHERE r.id = m.registration_id AND r.invalidated_at IS NULL OFFSET 0) r"
        "  WHERE m.thread_id = %(thread)s AND NOT m.removed_pending)"
        " UPDATE bothy.push_marks m SET removed_pending = true FROM marked k"
        " WHERE m.registration_id = k.registration_id AND m.thread_id = %(thread)s"
        " RETURNING m.registration_id, m.user_id",
        {"thread": thread_id},
    ).fetchall()
    if not rows:
        return 0
    writer = JobWriter(conn, clearing.now)
    at = clearing.now + clearing.delay
    for registration_id, user_id in rows:
        writer.add(
            JobSpec(
                kind=PUSH_REMOVED,
                args={
                    "user_id": str(user_id),
                    "registration_id": str(registration_id),
                    "thread_id": thread_id,
                },
                scheduled_at=at,
                max_attempts=clearing.max_attempts,
            )
        )
    return writer.finish()


def take_removed_pending(
    conn: Conn, keys: Collection[tuple[str, str]]
) -> dict[tuple[str, str], datetime]:
    """For (registration_id, thread_id) keys: each existing mark's ``marked_at``, its
    ``removed_pending`` flag taken back (a deletion from now on queues another)."""
    if not keys:
        return {}
    keys = list(keys)
    # The marks by their key (``= ANY``: one index descent per key, whatever the count;
    # joined to the pairs as a table the planner scanned the marks whole).
    registrations = json.dumps([k[0] for k in keys])
    rows = conn.execute(
        "UPDATE bothy.push_marks m SET removed_pending = false"
        " FROM ROWS FROM (json_array_elements_text(%(r)s::json),"
        "  json_array_elements_text(%(t)s::json)) AS k(registration_id, thread_id)"
        " WHERE m.registration_id = ANY(ARRAY(SELECT json_array_elements_text(%(r)s::json)))"
        " AND m.registration_id = k.registration_id AND m.thread_id = k.thread_id"
        " RETURNING m.registration_id, m.thread_id, m.marked_at",
        {"r": registrations, "t": json.dumps([k[1] for k in keys])},
    ).fetchall()
    return {(str(r[0]), str(r[1])): r[2] for r in rows}


def take_pending(conn: Conn, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
    """For (registration_id, thread_id) keys: each existing mark's ``marked_at``, its
    pending flag taken back (a read from now on queues another clear)."""
    if not keys:
        return {}
    keys = list(keys)
    rows = conn.execute(
        "UPDATE bothy.push_marks m SET clear_pending = false"
        " FROM unnest(%s::text[], %s::text[]) AS k(registration_id, thread_id)"
        " WHERE m.registration_id = k.registration_id AND m.thread_id = k.thread_id"
        " RETURNING m.registration_id, m.thread_id, m.marked_at",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(str(r[0]), str(r[1])): r[2] for r in rows}


def remove_many(conn: Conn, items: list[tuple[str, str, datetime]]) -> None:
    """Remove the marks (registration_id, thread_id) a clear was delivered for,
    unless marked again since ``marked_at`` (a newer push to clear later)."""
    if not items:
        return
    conn.execute(
        "DELETE FROM bothy.push_marks m"
        " USING unnest(%s::text[], %s::text[], %s::timestamptz[]) AS k(r, t, at)"
        " WHERE m.registration_id = k.r AND m.thread_id = k.t AND m.marked_at <= k.at",
        ([i[0] for i in items], [i[1] for i in items], [i[2] for i in items]),
    )


def read_positions(conn: Conn, pairs: Collection[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """``last_read_seq`` of (user_id, thread_id) pairs (absent: none stored)."""
    if not pairs:
        return {}
    pairs = list(pairs)
    rows = conn.execute(
        "SELECT s.user_id, s.thread_id, s.last_read_seq FROM bothy.read_states s"
        " JOIN unnest(%s::text[], %s::text[]) AS k(u, t)"
        " ON s.user_id = k.u AND s.thread_id = k.t",
        ([p[0] for p in pairs], [p[1] for p in pairs]),
    ).fetchall()
    return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
