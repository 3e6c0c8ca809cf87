"""Idempotent appends: what ``POST /v1/events`` answered for an ``Idempotency-Key``.

One row per (producer ``sub``, key): the digest of the batch it came with and
the seqs that batch got. The row is written in the append's own transaction,
so a key is taken exactly when its events are in the log. A second request
with the same key waits for the first one's transaction (the primary key),
then finds the row: the same digest answers the stored seqs and appends
nothing; another digest is a conflict. A row older than
``server.idempotency_window`` counts as gone (the key may be used afresh), and
housekeeping deletes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.store.db import Conn


@dataclass(frozen=True, slots=True)
class AppendOnce:
    """The answer for one keyed append.

    ``replayed``: the key was known with the same batch; ``seqs`` are the ones it
    got then and nothing was appended. ``conflict``: the key was known with
    another batch; nothing was appended and ``seqs`` is empty.
    """

    seqs: list[int]
    replayed: bool = False
    conflict: bool = False


def append_once(
    conn: Conn,
    *,
    producer: str,
    key: str,
    digest: bytes,
    append: Callable[[Conn], list[int]],
    now: datetime,
    window: timedelta,
) -> AppendOnce:
    """Run ``append`` once per (``producer``, ``key``) within ``window``.

    Call it in a transaction (``Database.run``): the key row and the appended
    events commit or roll back together, so a refused batch (``append`` raises)
    leaves the key unused.
    """
    while True:
        taken = conn.execute(
            "INSERT INTO bothy.append_keys (producer, key, request_hash, seqs, created_at)"
            " VALUES (%s, %s, %s, '{}', %s)"
            " ON CONFLICT (producer, key) DO UPDATE SET request_hash = EXCLUDED.request_hash,"
            " seqs = '{}', created_at = EXCLUDED.created_at"
            " WHERE bothy.append_keys.created_at <= %s RETURNING 1",
            (producer, key, digest, now, now - window),
        ).fetchone()
        if taken is not None:
            break
        row = conn.execute(
            "SELECT request_hash, seqs FROM bothy.append_keys WHERE producer = %s AND key = %s",
            (producer, key),
        ).fetchone()
        if row is None:
            continue  # pruned in between: the key is free again
        if bytes(row[0]) != digest:
            return AppendOnce([], conflict=True)
        return AppendOnce([int(s) for s in row[1]], replayed=True)
    seqs = append(conn)
    conn.execute(
        "UPDATE bothy.append_keys SET seqs = %s WHERE producer = %s AND key = %s",
        (seqs, producer, key),
    )
    return AppendOnce(seqs)


def prune(conn: Conn, older_than: datetime) -> int:
    """Delete keys taken before ``older_than``; return how many went."""
    return conn.execute(
        "DELETE FROM bothy.append_keys WHERE created_at < %s", (older_than,)
    ).rowcount
