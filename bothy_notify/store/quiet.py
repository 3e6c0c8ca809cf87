"""Quiet hours in the store: each person's settings, the pushes held while they are
quiet, and the pending summary of a quiet period (issue 20).

``bothy.quiet_hours`` holds a person's settings as one JSON document (``json``:
the round reads it whole, as its stored text), the shape ``GET /v1/quiet-hours``
answers (the notify layer reads it:
:func:`bothy_notify.notify.domain.quiet.quiet_from_doc`). A push that
``notify.push_send`` holds becomes a row of ``bothy.held_pushes`` per (person,
thread) (:func:`hold_many`), and the first hold of a quiet period queues the
person's ``notify.quiet_summary`` at its end; ``summary_key`` names that job
while it is pending, so that changing the settings moves it (:func:`save`) and
holds after it ran queue the next one. The summary takes the held rows
(:func:`take_held`) and gives the key back in the same transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg.types.json import Json

from bothy_notify.kernel.ids import new_id
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import JobSpec, JobWriter

QUIET_SUMMARY = "notify.quiet_summary"
SUMMARY_MAX_ATTEMPTS = 5
"""The person's summary job only reads and queues (its sends are jobs of their own)."""


@dataclass(frozen=True, slots=True)
class Held:
    """One push held: its person, its thread (``None`` for a hint without one, then
    ``nid`` keys it), its category, and when the person's quiet period ends."""

    user_id: str
    thread_id: str | None
    nid: str
    category: str
    ends_at: datetime

    def __repr__(self) -> str:
        return f"Held(category={self.category!r})"


def doc_of(conn: Conn, user_id: str, *, lock: bool = False) -> dict[str, Any] | None:
    """The stored settings document of ``user_id`` (``None``: never set); ``lock``
    holds the row until the caller's commit (a change of the settings waits)."""
    row = conn.execute(
        "SELECT doc FROM bothy.quiet_hours WHERE user_id = %s" + (" FOR UPDATE" if lock else ""),
        (user_id,),
    ).fetchone()
    return dict(row[0]) if row else None


def docs_of(conn: Conn, users: Collection[str]) -> dict[str, str]:
    """The stored documents (as JSON text) of those of ``users`` who set any."""
    if not users:
        return {}
    # The keys as one JSON array, each row read by its key (as the round's reads:
    # with the keys as a plain array the planner scans the table for a large batch).
    rows = conn.execute(
        "SELECT k.u, q.doc::text FROM json_array_elements_text(%s::json) AS k(u)"
        " JOIN LATERAL (SELECT q.doc FROM bothy.quiet_hours q WHERE q.user_id = k.u"
        "  OFFSET 0) q ON true",
        (orjson.dumps(sorted(users)).decode(),),
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def save(conn: Conn, user_id: str, doc: Mapping[str, Any], now: datetime) -> str | None:
    """Store the person's settings; returns the key of their pending summary, if any
    (locked with the row until the caller's commit, so the caller can move it)."""
    row = conn.execute(
        "INSERT INTO bothy.quiet_hours (user_id, doc, updated_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (user_id) DO UPDATE SET doc = EXCLUDED.doc, updated_at = EXCLUDED.updated_at"
        " RETURNING summary_key",
        (user_id, Json(dict(doc)), now),
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def move_summary(conn: Conn, key: str, at: datetime) -> bool:
    """Move the pending summary job ``key`` to ``at``; whether one was waiting."""
    moved = conn.execute(
        "UPDATE bothy.jobs SET scheduled_at = %s WHERE unique_key = %s AND state = 'available'",
        (at, key),
    ).rowcount
    if moved:
        conn.execute("SELECT pg_notify('bothy_jobs', '')")
    return bool(moved)


def hold_many(conn: Conn, items: list[Held], now: datetime) -> None:
    """Record held pushes (one row per person and thread, keeping the thread's
    newest message), and queue each person's summary at the end of their quiet
    period unless one is pending."""
    if not items:
        return
    # The settings rows first, in key order: a summary taking the held rows
    # meanwhile either waits for this commit or has given its key back before.
    conn.execute(
        "SELECT 1 FROM bothy.quiet_hours WHERE user_id = ANY(%s) ORDER BY user_id FOR UPDATE",
        (sorted({i.user_id for i in items}),),
    )
    conn.execute(
        "INSERT INTO bothy.held_pushes (user_id, item, thread_id, seq, category, held_at)"
        " SELECT k.u, coalesce(k.t, k.n), k.t, coalesce(t.last_message_seq, 0), k.c, %s"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) AS k(u, t, n, c)"
        " LEFT JOIN bothy.threads t ON t.thread_id = k.t"
        " ON CONFLICT (user_id, item) DO UPDATE SET seq = greatest(bothy.held_pushes.seq,"
        " EXCLUDED.seq), held_at = EXCLUDED.held_at",
        (
            now,
            [i.user_id for i in items],
            [i.thread_id for i in items],
            [i.nid for i in items],
            [i.category for i in items],
        ),
    )
    ends: dict[str, datetime] = {}
    for item in items:
        ends[item.user_id] = max(ends.get(item.user_id, item.ends_at), item.ends_at)
    keys = {user: f"qs:{user}:{new_id()}" for user in ends}
    rows = conn.execute(
        "UPDATE bothy.quiet_hours q SET summary_key = k.key"
        " FROM unnest(%s::text[], %s::text[]) AS k(u, key)"
        " WHERE q.user_id = k.u AND q.summary_key IS NULL RETURNING q.user_id",
        (list(keys), list(keys.values())),
    ).fetchall()
    if not rows:
        return
    writer = JobWriter(conn, now)
    for (user_id,) in rows:
        writer.add(
            JobSpec(
                kind=QUIET_SUMMARY,
                args={"user_id": str(user_id)},
                scheduled_at=ends[str(user_id)],
                max_attempts=SUMMARY_MAX_ATTEMPTS,
                unique_key=keys[str(user_id)],
            )
        )
    writer.finish()


def take_held(conn: Conn, user_id: str) -> list[tuple[str | None, int]]:
    """Remove the person's held pushes and give back their pending summary's key (the
    next hold queues a new one); returns each held (thread_id or ``None``, seq).

    Locks the person's settings row first (if the caller has not), so a hold
    committing meanwhile either came before (and is taken here) or finds no summary
    pending and queues one.
    """
    conn.execute("UPDATE bothy.quiet_hours SET summary_key = NULL WHERE user_id = %s", (user_id,))
    rows = conn.execute(
        "DELETE FROM bothy.held_pushes WHERE user_id = %s RETURNING thread_id, seq", (user_id,)
    ).fetchall()
    return [(None if r[0] is None else str(r[0]), int(r[1])) for r in rows]


def summary_targets(conn: Conn, user_id: str) -> list[str]:
    """The person's active registrations on devices not revoked (who gets a summary)."""
    rows = conn.execute(
        "SELECT r.id FROM bothy.push_registrations r LEFT JOIN bothy.devices d"
        " ON d.user_id = r.user_id AND d.device_id = r.device_id"
        " WHERE r.user_id = %s AND r.invalidated_at IS NULL"
        " AND coalesce(d.state, 'active') = 'active' ORDER BY r.id",
        (user_id,),
    ).fetchall()
    return [str(r[0]) for r in rows]
