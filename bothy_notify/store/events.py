"""The event log: append, validate, read after the cursor, advance the cursor.

Ordering: the consumer reads only events whose appending transaction is older
than every transaction still running (``xid < pg_snapshot_xmin``), in
``(xid, seq)`` order. An event whose transaction commits after a later-numbered
one is therefore never skipped, which a plain ``seq > cursor`` read would do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from bothy_notify.store.db import Conn, Database, StoreError
from bothy_notify.store.direct import StatementError
from bothy_notify.store.fastcheck import Check, compile_check
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


def _max_decoded_bytes(
    validator: Any, limit: int, instance: object, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """``maxDecodedBytes``: the most bytes a standard base64 string decodes to.

    Ours, not JSON Schema's; ``bothy.validate_json`` reads it the same way. It
    judges only strings of the form the schema's ``pattern`` allows (the SQL
    validator checks the pattern first and stops there).
    """
    if not isinstance(instance, str):
        return
    pattern = schema.get("pattern")
    if pattern is not None and not re.search(pattern, instance):
        return
    decoded = len(instance) // 4 * 3 - (len(instance) - len(instance.rstrip("=")))
    if decoded > limit:
        yield ValidationError(f"decodes to more than {limit} bytes")


_Validator = validators.extend(Draft202012Validator, {"maxDecodedBytes": _max_decoded_bytes})
"""Draft 2020-12 with ``maxDecodedBytes`` (schemas/events/envelope.published.json)."""


class EventValidator:
    """Validates events against ``schemas/events/*.json`` before they reach the database.

    ``bothy.append_event`` validates again with the same schemas (the outbox
    path has no Python in front of it); a test keeps both in agreement.

    Each schema is also compiled into a yes/no check
    (:mod:`bothy_notify.store.fastcheck`) that answers a valid payload without
    ``jsonschema``; only a payload it refuses is walked by ``jsonschema``, for
    the error that names the field.
    """

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        schemas = schemas or load_event_schemas()
        self._validators = {name: _Validator(schema) for name, schema in schemas.items()}
        self._checks: dict[str, Check | None] = {
            name: compile_check(schema, _Validator.TYPE_CHECKER) for name, schema in schemas.items()
        }

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self._validators)

    def check(self, event_type: object, payload: object, where: str = "") -> None:
        """Raise :class:`EventRejected` naming the first bad field."""
        validator = self._validators.get(event_type) if isinstance(event_type, str) else None
        if validator is None:
            raise EventRejected(f"{where}type", "unknown event type")
        fast = self._checks[event_type]  # type: ignore[index]  # a str: it has a validator
        if fast is not None and fast(payload):
            return
        error = next(iter(sorted(validator.iter_errors(payload), key=_error_order)), None)
        if error is not None:
            raise EventRejected(f"{where}payload{_path(error)}", _problem(error))


def _error_order(error: ValidationError) -> tuple[int, str]:
    return (len(error.absolute_path), str(list(error.absolute_path)))


def _path(error: ValidationError) -> str:
    parts = ""
    for part in error.absolute_path:
        parts += f"[{part}]" if isinstance(part, int) else f".{part}"
    if error.validator == "required":
        missing = [
            name
            for name in error.validator_value
            if isinstance(error.instance, dict) and name not in error.instance
        ]
        if missing:
            parts += f".{missing[0]}"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra and all(c.isalpha() or c == "_" for c in extra[0]) and len(extra[0]) <= 40:
            parts += f".{extra[0]}"
    return parts


_PROBLEMS = {
    "required": "required",
    "additionalProperties": "unknown field",
    "enum": "not one of the allowed values",
    "pattern": "does not have the required form",
    "minLength": "too short",
    "maxLength": "too long",
    "maxDecodedBytes": "too long",
    "minimum": "too small",
    "maximum": "too large",
    "minItems": "too few items",
    "maxItems": "too many items",
}


def _problem(error: ValidationError) -> str:
    if error.validator == "type":
        expected = error.validator_value
        return {
            "object": "expected an object",
            "array": "expected an array",
            "integer": "expected an integer",
        }.get(expected, f"expected a {expected}")
    return _PROBLEMS.get(str(error.validator), "invalid")


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


async def append_direct(db: Database, events: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]:
    """:func:`append` as one statement of its own (it commits alone) on the Trio
    thread's connection (:meth:`Database.query_direct`): all or nothing."""
    if not events:
        return []
    batch = json.dumps([[t, p] for t, p in events], separators=(",", ":")).encode()
    try:
        rows = await db.query_direct(b"bothy_append_events", APPEND_STATEMENT, [batch])
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
