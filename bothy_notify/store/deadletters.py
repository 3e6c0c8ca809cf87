"""Dead letters: events the consumer round could not apply or decide.

A row says which event (``seq``, ``xid``, ``type``), what went wrong (the
error's type and the code location it came from, never a message that could
quote a value) and when. The event itself stays in ``bothy.events``; the
round's cursor has moved past it, so every other event is decided without it.
``bothy-notify events retry`` replays a row and deletes it when the replay
commits (:mod:`bothy_notify.notify.replay`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from bothy_notify.store.db import Conn
from bothy_notify.store.events import Event


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered event (no payload: it stays in the log)."""

    seq: int
    xid: int
    type: str
    error_type: str
    error_where: str
    dead_lettered_at: datetime
    retries: int
    last_retry_at: datetime | None


_COLUMNS = (
    "seq, xid::text::bigint, type, error_type, error_where, dead_lettered_at, retries,"
    " last_retry_at"
)


def record(conn: Conn, event: Event, error_type: str, where: str, now: datetime) -> None:
    """Set ``event`` aside, in the caller's transaction (the round's, with its cursor)."""
    conn.execute(
        "INSERT INTO bothy.dead_letters (seq, xid, type, error_type, error_where,"
        " dead_lettered_at) VALUES (%s, %s::text::xid8, %s, %s, %s, %s)"
        " ON CONFLICT (seq) DO UPDATE SET error_type = EXCLUDED.error_type,"
        " error_where = EXCLUDED.error_where",
        (event.seq, str(event.xid), event.type, error_type, where, now),
    )


def list_all(conn: Conn, seqs: Sequence[int] | None = None) -> list[DeadLetter]:
    """Every dead letter in log order, or those of ``seqs``."""
    if seqs is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM bothy.dead_letters ORDER BY xid, seq")
    else:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM bothy.dead_letters WHERE seq = ANY(%s) ORDER BY xid, seq",
            (list(seqs),),
        )
    return [DeadLetter(*r) for r in rows.fetchall()]


def load_event(conn: Conn, seq: int) -> Event | None:
    """The dead letter's event from the log, locking its dead-letter row (so two
    replays of one event never run at once); ``None`` when either is gone."""
    row = conn.execute(
        "SELECT e.seq, e.xid::text::bigint, e.type, e.payload, e.occurred_at"
        " FROM bothy.dead_letters d JOIN bothy.events e ON e.seq = d.seq"
        " WHERE d.seq = %s FOR UPDATE OF d",
        (seq,),
    ).fetchone()
    return Event(*row) if row else None


def remove(conn: Conn, seq: int) -> None:
    """Delete the row of a dead letter whose replay is committing with this transaction."""
    conn.execute("DELETE FROM bothy.dead_letters WHERE seq = %s", (seq,))


def count_retry(conn: Conn, seq: int, error_type: str, where: str, now: datetime) -> None:
    """Record a replay that failed again, with its (new) error type and location."""
    conn.execute(
        "UPDATE bothy.dead_letters SET retries = retries + 1, last_retry_at = %s,"
        " error_type = %s, error_where = %s WHERE seq = %s",
        (now, error_type, where, seq),
    )
