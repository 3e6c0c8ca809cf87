"""The event log: ``bothy.append_event`` refuses naming the field, a refused batch
leaves nothing, and an event that commits late is never skipped. (The proof that
the SQL and Python checks agree with the schemas on generated payloads is
``test_event_checks.py``; the cases here are the ones worth reading.)"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from bothy_notify.notify.catalogue import APP_KIND_PATTERN, is_app_kind
from bothy_notify.store import events as eventlog
from bothy_notify.store.events import Cursor, EventRejected, EventValidator
from bothy_notify.store.migrate import load_event_schemas
from testkit.events import VALID_PAYLOADS


def sql_check(conn: psycopg.Connection[Any], type_: str, payload: Any) -> str | None:
    """None when bothy.append_event accepts it, else its message (rolled back either way)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT bothy.append_event(%s, %s::jsonb)", (type_, json.dumps(payload)))
    except psycopg.errors.InvalidParameterValue as exc:
        return exc.diag.message_primary
    except psycopg.errors.DataError:
        return "refused by PostgreSQL itself (a value jsonb cannot hold)"
    return None


def test_every_event_type_has_a_schema_and_a_valid_example() -> None:
    assert set(load_event_schemas()) == set(VALID_PAYLOADS)
    validator = EventValidator()
    for type_, payload in VALID_PAYLOADS.items():
        validator.check(type_, payload)


def test_append_event_accepts_valid_events_and_notifies(database_url: str) -> None:
    with (
        psycopg.connect(database_url, autocommit=True) as listener,
        psycopg.connect(database_url) as conn,
    ):
        listener.execute("LISTEN bothy_events")
        seqs = [
            conn.execute("SELECT bothy.append_event(%s, %s::jsonb)", (t, json.dumps(p))).fetchone()[
                0
            ]  # type: ignore[index]
            for t, p in VALID_PAYLOADS.items()
        ]
        conn.commit()
        assert seqs == sorted(seqs) and len(set(seqs)) == len(VALID_PAYLOADS)
        assert [n.channel for n in listener.notifies(timeout=2, stop_after=1)] == ["bothy_events"]


@pytest.mark.parametrize(
    ("type_", "payload", "message"),
    [
        ("nope.event", {}, "bothy: type: unknown event type"),
        ("message.created", {"thread_id": "t1"}, "bothy: payload.message_id: required"),
        (
            "thread.read",
            {"user_id": "a", "thread_id": "t", "seq": "4"},
            "bothy: payload.seq: expected an integer",
        ),
        (
            "thread.read",
            {"user_id": "a", "thread_id": "t", "seq": -1},
            "bothy: payload.seq: too small",
        ),
        (
            "user.upserted",
            {"user_id": "a b", "kind": "human", "active": True},
            "bothy: payload.user_id: does not have the required form",
        ),
        (
            "user.upserted",
            {"user_id": "a", "kind": "robot", "active": True},
            "bothy: payload.kind: not one of the allowed values",
        ),
        (
            "member.added",
            {"user_id": "a", "scope_id": "s", "extra": 1},
            "bothy: payload.extra: unknown field",
        ),
        (
            "message.created",
            {**VALID_PAYLOADS["message.created"], "mentions": ["ok", "not ok"]},
            "bothy: payload.mentions[1]: does not have the required form",
        ),
    ],
)
def test_append_event_refuses_naming_the_field(
    database_url: str, type_: str, payload: Any, message: str
) -> None:
    with psycopg.connect(database_url) as conn:
        assert sql_check(conn, type_, payload) == message
        count = conn.execute("SELECT count(*) FROM bothy.events").fetchone()
        assert count == (0,)


KIND_SHAPES = [
    ("social:friend_request", True),
    ("acme/chat:invite", True),
    ("acme/chat:social:invite", True),
    ("acme/chat:other/app:invite", True),
    ("acme/chat:message", True),
    ("37signals/camp-fire:v2.ping", True),
    ("a:b:c", True),
    ("message", False),
    ("acme/chat/x:invite", False),
    ("acme/chat:a/b:c/d:e", False),
    ("acme/chat:x:y:z", False),
    ("Acme/chat:invite", False),
    ("acme/chat:Invite", False),
    ("acme/chat:", False),
    (":invite", False),
    ("acme//chat:invite", False),
    ("-acme/chat:invite", False),
    ("acme/chat:9lives", False),
    ("acme/chat:invite ", False),
    ("a" * 33 + ":invite", False),
    ("acme/chat:" + "n" * 65, False),
]


def test_the_schemas_kind_pattern_is_the_catalogues() -> None:
    schema = load_event_schemas()["hint.requested"]
    assert schema["properties"]["kind"]["pattern"] == APP_KIND_PATTERN


@pytest.mark.parametrize(("kind", "valid"), KIND_SHAPES)
def test_kind_codes_are_checked_by_shape_alike_in_sql_and_python(
    database_url: str, kind: str, valid: bool
) -> None:
    payload = {**VALID_PAYLOADS["hint.requested"], "kind": kind}
    try:
        EventValidator().check("hint.requested", payload)
        python_ok = True
    except EventRejected:
        python_ok = False
    with psycopg.connect(database_url) as conn:
        sql_ok = sql_check(conn, "hint.requested", payload) is None
    assert python_ok == sql_ok == valid == is_app_kind(kind)


def test_a_refused_event_leaves_nothing_of_its_batch(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(EventRejected) as error, conn.transaction():
            eventlog.append(
                conn,
                [
                    ("user.upserted", VALID_PAYLOADS["user.upserted"]),
                    ("thread.read", {"user_id": "a"}),
                ],
            )
        assert error.value.field == "payload.thread_id"
        assert conn.execute("SELECT count(*) FROM bothy.events").fetchone() == (0,)


def test_an_event_that_commits_late_is_not_skipped(database_url: str) -> None:
    with (
        psycopg.connect(database_url) as early,
        psycopg.connect(database_url) as late,
        psycopg.connect(database_url) as reader,
    ):
        early.execute(
            'SELECT bothy.append_event(\'member.added\', \'{"user_id": "a", "scope_id": "s"}\')'
        )  # seq 1, not committed
        late.execute(
            'SELECT bothy.append_event(\'member.added\', \'{"user_id": "b", "scope_id": "s"}\')'
        )  # seq 2
        late.commit()
        with reader.transaction():
            assert eventlog.lock_and_read(reader, 10) == (Cursor(0, 0), [])
        early.commit()
        with reader.transaction():
            _cursor, batch = eventlog.lock_and_read(reader, 10)
            last = Cursor(batch[-1].xid, batch[-1].seq)
            eventlog.save_cursor(reader, last, datetime.now(UTC))
        assert [e.payload["user_id"] for e in batch] == ["a", "b"]
        with reader.transaction():
            assert eventlog.lock_and_read(reader, 10) == (last, [])


def test_a_value_jsonb_cannot_hold_is_refused_not_crashed(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(EventRejected) as error, conn.transaction():
            eventlog.append(conn, [("access.expiring", {"user_id": "a", "target_id": "\x00"})])
        assert error.value.field == "payload"


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


ENVELOPE = VALID_PAYLOADS["envelope.published"]


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({"topic": _b64(b"\x01" + bytes(32))}, True),
        ({"topic": _b64(b"\x02" + bytes(16))}, False),
        ({"topic": _b64(b"\x00" + bytes(32))}, False),
        ({"topic": _b64(b"\x01" + bytes(16))}, False),
        ({"topic": "AAECAwQFBgcICQoLDA0ODxB="}, False),  # not canonical
        ({"kind": "welcome", "should_push": False}, True),
        ({"kind": "key_package"}, False),
        ({"sender_hmac": _b64(bytes(31))}, False),
        ({"data": ""}, True),
        ({"data": "AB=="}, False),  # stray bits: not canonical
        ({"data": _b64(bytes(65_536))}, True),  # 64 KiB
        ({"data": _b64(bytes(65_539))}, False),
        ({"data": "c2VhbGVk\nIGJ5dGVz"}, False),
    ],
)
def test_envelope_payloads_are_judged_alike_in_sql_and_python(
    database_url: str, change: dict[str, Any], valid: bool
) -> None:
    payload = {**ENVELOPE, **change}
    try:
        EventValidator().check("envelope.published", payload)
        python_ok = True
    except EventRejected:
        python_ok = False
    with psycopg.connect(database_url) as conn:
        sql_ok = sql_check(conn, "envelope.published", payload) is None
    assert python_ok is sql_ok is valid


def test_the_round_reads_payloads_as_stored_even_beyond_64_bit_integers(
    database_url: str,
) -> None:
    # What jsonb may hold that orjson refuses (the round then decodes with json).
    payloads = [
        {"user_id": "alex", "n": 2**70, "nested": {"xs": [1.5, -3, None, True, "é"]}},
        {"thread_id": "t1", "message_id": "m1", "thread_seq": 7, "mentions": []},
    ]
    with psycopg.connect(database_url) as conn:
        for payload in payloads:
            conn.execute(
                "INSERT INTO bothy.events (type, payload) VALUES ('message.created', %s::jsonb)",
                (json.dumps(payload),),
            )
        conn.commit()
        _cursor, batch = eventlog.lock_and_read(conn, 10)

    assert [e.payload for e in batch] == payloads
