"""Idempotency of app-requested hints: who already had a request, and when.

A row (dedupe key, recipient, seen_at) says the recipient was considered for
that request at ``seen_at``. Within ``notify.idempotency_window`` a second
request with the same key gives that recipient nothing; after the window the
row counts as gone (housekeeping deletes it, and a claim renews it first if
housekeeping has not run yet).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from bothy_notify.store.db import Conn


def claim(
    conn: Conn, key: str, user_ids: Collection[str], *, now: datetime, window: timedelta
) -> set[str]:
    """Record ``key`` for ``user_ids`` at ``now``; return those who did not have it yet.

    A recipient whose row is older than ``window`` counts as new (the row is
    renewed). One statement; run it in the caller's transaction so the record
    commits together with the jobs it allowed.
    """
    if not user_ids:
        return set()
    rows = conn.execute(
        "INSERT INTO bothy.hint_idempotency (dedupe_key, user_id, seen_at)"
        " SELECT %s, u, %s FROM unnest(%s::text[]) AS u"
        " ON CONFLICT (dedupe_key, user_id) DO UPDATE SET seen_at = EXCLUDED.seen_at"
        " WHERE bothy.hint_idempotency.seen_at <= %s"
        " RETURNING user_id",
        (key, now, list(dict.fromkeys(user_ids)), now - window),
    ).fetchall()
    return {r[0] for r in rows}


def prune(conn: Conn, older_than: datetime) -> int:
    """Delete records seen before ``older_than``; return how many went."""
    return conn.execute(
        "DELETE FROM bothy.hint_idempotency WHERE seen_at < %s", (older_than,)
    ).rowcount
