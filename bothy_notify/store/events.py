"""The event log: append, validate, read after the cursor, advance the cursor.

Ordering: the consumer reads only events whose appending transaction is older
than every transaction still running (``xid < pg_snapshot_xmin``), in
``(xid, seq)`` order. An event whose transaction commits after a later-numbered
one is therefore never skipped, which a plain ``seq > cursor`` read would do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg

from bothy_notify.store.db import Conn, Database, StoreError
from bothy_notify.store.direct import StatementError
from bothy_notify.store.eventcheck import Check, compile_schema
from bothy_notify.store.migrate import load_event_schemas

CURSOR_NAME = "notify"


class EventRejected(StoreError):
    """An event failed its type's schema; ``field`` names where (never a value)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    xid: int
    type: str
    payload: Mapping[str, Any]
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class Cursor:
    xid: int
    seq: int


class EventValidator:
    """Checks events against ``schemas/events/*.json`` before they reach the database.

    Each schema is compiled once into closures (:mod:`bothy_notify.store.eventcheck`)
    that answer a valid payload cheaply and name the first bad field of another.
    ``bothy.append_event`` checks again in SQL (the outbox path has no Python in
    front of it) with a function generated from the same schemas
    (:mod:`bothy_notify.store.eventsql`), in the same order and words.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        schemas = load_event_schemas() if schemas is None else schemas
        self._checks: dict[str, Check] = {
            name: compile_schema(schema) for name, schema in schemas.items()
        }

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self._checks)

    def check(self, event_type: object, payload: object, where: str = "") -> None:
        """Raise :class:`EventRejected` naming the first bad field (``where`` goes
        before it: ``events[3].``)."""
        check = self._checks.get(event_type) if isinstance(event_type, str) else None
        if check is None:
            raise EventRejected(f"{where}type", "unknown event type")
        refusal = check(payload)
        if refusal is not None:
            raise EventRejected(refusal.field(f"{where}payload"), refusal.problem.value)


def append(conn: Conn, events: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
    """Append ``events`` through ``bothy.append_event`` in the caller's transaction.

    Returns their seqs in order. A refused event raises :class:`EventRejected`
    and, since the caller's transaction rolls back, none of the batch is kept.
    """
    if not events:
        return []
    types = [t for t, _ in events]
    payloads = [json.dumps(p, separators=(",", ":")) for _, p in events]
    try:
        rows = conn.execute(
            "SELECT bothy.append_event(t, p::jsonb) FROM unnest(%s::text[], %s::text[])"
            " WITH ORDINALITY AS e(t, p, n) ORDER BY n",
            (types, payloads),
        ).fetchall()
    except psycopg.errors.DataError as exc:  # InvalidParameterValue is one too
        raise _rejection(exc.sqlstate or "", exc.diag.message_primary or "") from None
    return [int(r[0]) for r in rows]


APPEND_STATEMENT = (
    b"SELECT bothy.append_event(e->>0, e->1)"
    b" FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS x(e, n) ORDER BY n"
)
""":func:`append_direct`'s statement: the batch as one JSON array of [type, payload]."""

APPEND_QUIETLY_STATEMENT = (
    b"WITH i AS (INSERT INTO bothy.events (type, payload)"
    b" SELECT e->>0, bothy.checked_event(e->>0, e->1)"
    b" FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS x(e, n) ORDER BY n"
    b" RETURNING seq) SELECT seq FROM i ORDER BY seq"
)
"""What ``bothy.append_event`` does (the same check), without its ``NOTIFY bothy_events``.
The seqs are drawn in the batch's order, so in seq order they are the batch's."""


async def append_direct(
    db: Database, events: Sequence[tuple[str, Mapping[str, Any]]], *, notify: bool = True
) -> list[int]:
    """:func:`append` as one statement of its own (it commits alone) on the Trio
    thread's connection (:meth:`Database.query_direct`): all or nothing.

    ``notify=False`` leaves out ``NOTIFY bothy_events``: the caller wakes the round
    itself, once this returned (it holds the round in its own process).
    """
    if not events:
        return []
    batch = json.dumps([[t, p] for t, p in events], separators=(",", ":")).encode()
    name, statement = (
        (b"bothy_append_events", APPEND_STATEMENT)
        if notify
        else (b"bothy_append_events_quietly", APPEND_QUIETLY_STATEMENT)
    )
    try:
        rows = await db.query_direct(name, statement, [batch])
    except StatementError as exc:
        if exc.sqlstate.startswith("22"):  # data exceptions: the events' own fault
            raise _rejection(exc.sqlstate, exc.message) from None
        raise
    return [int(r[0] or b"0") for r in rows]


def _rejection(sqlstate: str, message: str) -> EventRejected:
    """The :class:`EventRejected` for a data exception of ``bothy.append_event``:
    its own check names the field (``bothy: field: problem``, SQLSTATE 22023);
    other data errors (a ``\\u0000`` escape, which jsonb cannot hold) have no field."""
    if sqlstate == "22023":
        field, _, problem = message.removeprefix("bothy: ").partition(": ")
        return EventRejected(field, problem or "invalid")
    return EventRejected("payload", "contains a value PostgreSQL cannot store")


def lock_and_read(conn: Conn, limit: int) -> tuple[Cursor, list[Event]]:
    """Lock the cursor row and read the batch after it, in one statement (the round's
    first step; the lock keeps a second holder out even if the advisory lock failed)."""
    rows = conn.execute(
        "WITH c AS (SELECT xid, seq FROM bothy.consumer_cursor WHERE name = %s FOR UPDATE)"
        " SELECT c.xid::text::bigint, c.seq, e.seq, e.xid::text::bigint, e.type, e.payload,"
        " e.occurred_at FROM c LEFT JOIN LATERAL ("
        # An envelope's payload (topic mode) is read by the dispatch statement in SQL
        # only, for the subscriptions it reaches: it never comes to the round.
        # The payload comes as text, decoded here with orjson (see _payload).
        "   SELECT seq, xid, type, CASE WHEN type = 'envelope.published' THEN '{}'"
        "          ELSE payload::text END AS payload, occurred_at FROM bothy.events"
        "   WHERE (xid, seq) > (c.xid, c.seq)"
        "     AND xid < pg_snapshot_xmin(pg_current_snapshot())"
        "   ORDER BY xid, seq LIMIT %s) e ON true"
        " ORDER BY e.xid, e.seq",
        (CURSOR_NAME, limit),
    ).fetchall()
    if not rows:
        raise StoreError("the consumer cursor is missing; run bothy-notify migrate")
    cursor = Cursor(int(rows[0][0]), int(rows[0][1]))
    return cursor, [Event(r[2], r[3], r[4], _payload(r[5]), r[6]) for r in rows if r[2] is not None]


def _payload(text: str) -> Mapping[str, Any]:
    """A payload as stored (jsonb's text), decoded with orjson: the round reads a batch
    of them per round, and ``json.loads`` cost several times as much. An integer
    beyond 64 bits, which orjson refuses and jsonb may hold, falls back to ``json``."""
    try:
        value: Mapping[str, Any] = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = json.loads(text)
    return value


def save_cursor(conn: Conn, cursor: Cursor, now: datetime) -> None:
    conn.execute(
        "UPDATE bothy.consumer_cursor SET xid = %s::text::xid8, seq = %s, updated_at = %s"
        " WHERE name = %s",
        (str(cursor.xid), cursor.seq, now, CURSOR_NAME),
    )


@dataclass(frozen=True, slots=True)
class Lag:
    events: int
    oldest: datetime | None


def lag(conn: Conn) -> Lag:
    """How many events wait after the cursor, and when the oldest was appended."""
    row = conn.execute(
        "SELECT count(*), min(e.occurred_at) FROM bothy.events e, bothy.consumer_cursor c"
        " WHERE c.name = %s AND (e.xid, e.seq) > (c.xid, c.seq)",
        (CURSOR_NAME,),
    ).fetchone()
    assert row is not None
    return Lag(int(row[0]), row[1])


__all__ = [
    "Cursor",
    "Event",
    "EventRejected",
    "EventValidator",
    "Lag",
    "append",
    "lag",
    "lock_and_read",
    "save_cursor",
]
