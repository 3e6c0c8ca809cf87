"""Poison events: one event the round cannot apply or decide never stops it.

The culprit is dead-lettered (seq, type, error type; never its payload), every
other event is decided exactly as if it had not been there, and a lost
database is never mistaken for a poison event. The poisons here are real: an
event type a newer node's migration added, and payloads a database trigger
refuses (the projection cannot apply them), both in a barrier position and
inside a group of messages.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from bothy_notify.config import LiveConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import SKIP_REASONS, Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.notify.round import ROUND_LOCK_KEY, ConsumerRound, Isolation
from bothy_notify.notify.routes import FailClosedRoutes
from tests.conftest import TEMPLATE
from tests.harness import make_config, wait_for
from tests.support.event_types import add_event_type

FUTURE_TYPE = "envelope.future"
"""An event type a newer node's migration added; this version has no projection for it."""

POISON_TRIGGERS = """
CREATE FUNCTION public.refuse_poison_member() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scope_id = 'poison-scope' THEN
        RAISE EXCEPTION 'refused by a test trigger';
    END IF;
    RETURN NEW;
END $$;
CREATE FUNCTION public.refuse_poison_thread() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.thread_id = 'poison-thread' THEN
        RAISE EXCEPTION 'refused by a test trigger';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON bothy.members
    FOR EACH ROW EXECUTE FUNCTION public.refuse_poison_member();
CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON bothy.threads
    FOR EACH ROW EXECUTE FUNCTION public.refuse_poison_thread();
"""


def message(thread: str, n: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    payload = {"thread_id": thread, "message_id": f"m{n}", "thread_seq": n, "author_id": "sam"}
    return "message.created", {**payload, **extra}


POISON_UNKNOWN = (FUTURE_TYPE, {"anything": 1})
POISON_MEMBER = ("member.added", {"user_id": "alex", "scope_id": "poison-scope"})
POISON_MESSAGE = message("poison-thread", 1)

SCENARIO: list[tuple[str, dict[str, Any]]] = [
    ("user.upserted", {"user_id": "alex", "kind": "human", "active": True}),
    ("user.upserted", {"user_id": "kim", "kind": "human", "active": True}),
    ("thread.upserted", {"thread_id": "t1", "space_id": "s1"}),
    ("thread.upserted", {"thread_id": "t2", "space_id": "s1"}),
    ("member.added", {"user_id": "alex", "scope_id": "s1"}),
    ("member.added", {"user_id": "kim", "scope_id": "s1"}),
    ("thread.followed", {"user_id": "alex", "thread_id": "t1", "level": "all"}),
    ("thread.followed", {"user_id": "kim", "thread_id": "t1", "level": "all"}),
    ("thread.followed", {"user_id": "kim", "thread_id": "t2", "level": "all"}),
    message("t1", 1),
    POISON_UNKNOWN,
    message("t2", 1),
    ("thread.read", {"user_id": "alex", "thread_id": "t1", "seq": 2}),
    message("t1", 2),
    POISON_MESSAGE,
    message("t1", 3, mentions=["alex"]),
    POISON_MEMBER,
    ("member.removed", {"user_id": "kim", "scope_id": "s1"}),
    message("t1", 4),
    message("t2", 2),
]
POISONS = [POISON_UNKNOWN, POISON_MESSAGE, POISON_MEMBER]


@pytest.fixture
def twin_url(pg_url: str) -> Iterator[str]:
    """A second fresh database, for the same scenario without the poison events."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield make_conninfo(pg_url, dbname=name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def prepare(url: str, events: list[tuple[str, dict[str, Any]]]) -> None:
    """The future type registered (as a newer migration would), the poison triggers,
    one registration per person, then ``events`` appended through the outbox."""
    with psycopg.connect(url) as conn:
        add_event_type(conn, FUTURE_TYPE, {"type": "object"})
        conn.execute(POISON_TRIGGERS)
        for person in ("alex", "kim"):
            conn.execute(
                "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
                " created_at, renewed_at) VALUES (%s, %s, %s, 'fake', %s, now(), now())",
                (f"r-{person}", person, f"phone-{person}", f"tok-{person}"),
            )
        for type_, payload in events:
            conn.execute("SELECT bothy.append_event(%s, %s::jsonb)", (type_, json.dumps(payload)))


def new_round(url: str, metrics: Metrics, **kw: Any) -> ConsumerRound:
    return ConsumerRound(
        database_url=url,
        config=LiveConfig(make_config()),
        clock=FakeClock(),
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=metrics,
        **kw,
    )


def caught_up(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT seq FROM bothy.consumer_cursor)"
            " >= (SELECT coalesce(max(seq), 0) FROM bothy.events)"
        ).fetchone()
    return bool(row and row[0])


async def consume_all(consumer: ConsumerRound, url: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        await wait_for(
            lambda: trio.to_thread.run_sync(caught_up, url), timeout=20, what="the round"
        )
        nursery.cancel_scope.cancel()


def jobs(url: str) -> Counter[tuple[Any, ...]]:
    """Every job without what differs between two runs (its nid, its append time)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT kind, args FROM bothy.jobs").fetchall()
    return Counter(
        (kind, tuple(sorted((k, v) for k, v in args.items() if k not in ("nid", "appended_at"))))
        for kind, args in rows
    )


def projection(url: str) -> dict[str, list[tuple[Any, ...]]]:
    queries = {
        "users": "SELECT user_id, kind, active FROM bothy.users ORDER BY 1",
        "threads": "SELECT thread_id, space_id, channel_id, last_message_seq, unread_floor_seq"
        " FROM bothy.threads ORDER BY 1",
        "members": "SELECT scope_id, user_id FROM bothy.members ORDER BY 1, 2",
        "follows": "SELECT thread_id, user_id, level FROM bothy.follows ORDER BY 1, 2",
        "reads": "SELECT user_id, thread_id, last_read_seq FROM bothy.read_states ORDER BY 1, 2",
    }
    with psycopg.connect(url) as conn:
        return {name: conn.execute(q).fetchall() for name, q in queries.items()}


def dead_letters(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT d.type, d.error_type, e.payload->>'scope_id', e.payload->>'thread_id'"
            " FROM bothy.dead_letters d JOIN bothy.events e USING (seq) ORDER BY d.seq"
        ).fetchall()


def counted(metrics: Metrics) -> dict[str, float]:
    out = {reason: metrics.skipped(reason) for reason in SKIP_REASONS}
    for kind in ("message", "mention"):
        out[kind] = metrics.hints.labels(kind)._value.get()
    out["consumed"] = metrics.events_consumed._value.get()
    return out


async def test_every_other_event_is_decided_exactly_as_without_the_poison_ones(
    database_url: str, twin_url: str
) -> None:
    prepare(database_url, SCENARIO)
    prepare(twin_url, [e for e in SCENARIO if e not in POISONS])
    poisoned, clean = Metrics(), Metrics()
    await consume_all(new_round(database_url, poisoned), database_url)
    await consume_all(new_round(twin_url, clean), twin_url)

    assert jobs(database_url) == jobs(twin_url)
    assert sum(jobs(database_url).values()) > 0
    assert projection(database_url) == projection(twin_url)
    assert counted(poisoned) == counted(clean)
    assert dead_letters(database_url) == [
        (FUTURE_TYPE, "UnknownEventType", None, None),
        ("message.created", "StoreError(RaiseException)", None, "poison-thread"),
        ("member.added", "StoreError(RaiseException)", "poison-scope", None),
    ]


async def test_dead_letters_are_counted_by_type_with_unknown_types_as_one_label(
    database_url: str,
) -> None:
    prepare(database_url, SCENARIO)
    metrics = Metrics()
    consumer = new_round(database_url, metrics)
    await consume_all(consumer, database_url)
    assert consumer.dead_lettered == 3
    rendered = metrics.render().decode()
    assert 'bothy_events_dead_lettered_total{type="unknown"} 1.0' in rendered
    assert 'bothy_events_dead_lettered_total{type="message.created"} 1.0' in rendered
    assert 'bothy_events_dead_lettered_total{type="member.added"} 1.0' in rendered
    assert FUTURE_TYPE not in rendered


async def test_a_dead_letter_is_logged_by_type_and_location_never_by_payload(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    prepare(database_url, SCENARIO)
    with caplog.at_level(logging.WARNING, logger="bothy"):
        await consume_all(new_round(database_url, Metrics()), database_url)
    dead = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert [(r.__dict__["type"], r.__dict__["error_type"]) for r in dead] == [
        ("unknown", "UnknownEventType"),
        ("message.created", "StoreError(RaiseException)"),
        ("member.added", "StoreError(RaiseException)"),
    ]
    assert dead[2].__dict__["where"].startswith("bothy_notify/store/projections.py:")
    everything = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in ("poison-scope", "poison-thread", "alex", FUTURE_TYPE, "refused by"):
        assert secret not in everything


async def test_a_lost_database_connection_is_never_a_poison_event(database_url: str) -> None:
    prepare(database_url, [e for e in SCENARIO if e not in POISONS])
    killed: list[int] = []

    def lose_the_connection_once(outcome: RoundOutcome) -> None:
        if killed:
            return
        # The round's own backend is the one holding its advisory lock.
        with psycopg.connect(database_url, autocommit=True) as other:
            row = other.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                " AND ((classid::bigint << 32) | objid::bigint) = %s",
                (ROUND_LOCK_KEY,),
            ).fetchone()
        assert row is not None
        killed.append(row[0])

    consumer = new_round(database_url, Metrics(), before_commit=lose_the_connection_once)
    await consume_all(consumer, database_url)
    assert killed
    assert dead_letters(database_url) == []
    decided = jobs(database_url)
    assert decided and all(n == 1 for n in decided.values())


def test_isolation_halves_the_suspects_until_one_event_fails_alone() -> None:
    isolation = Isolation()
    assert isolation.limit(500) == 500
    # A group of messages at [40, 72) was being decided when the round failed.
    assert not isolation.failed(100, (40, 72))
    assert isolation.limit(500) == 40  # the clean head goes in one round
    isolation.succeeded(40)
    assert isolation.limit(500) == 16
    isolation.succeeded(16)  # the culprit is in the other half
    assert isolation.limit(500) == 8
    assert not isolation.failed(8, (0, 8))
    assert isolation.limit(500) == 4
    assert not isolation.failed(4, (0, 4))
    assert isolation.limit(500) == 2
    isolation.succeeded(2)
    assert isolation.limit(500) == 1
    assert isolation.failed(1, (0, 1))  # found: it failed alone
    assert not isolation.active and isolation.limit(500) == 500


def test_an_event_that_fails_alone_outside_isolation_gets_its_retry_first() -> None:
    isolation = Isolation()
    assert not isolation.failed(1, None)
    assert isolation.limit(500) == 1
    assert isolation.failed(1, None)


def test_a_failure_that_does_not_repeat_ends_the_isolation() -> None:
    isolation = Isolation()
    isolation.failed(10, None)
    isolation.succeeded(5)
    isolation.succeeded(5)
    assert not isolation.active


async def test_one_poison_among_a_thousand_events_costs_a_few_rounds_and_nothing_else(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    setup: list[tuple[str, dict[str, Any]]] = [
        ("user.upserted", {"user_id": "alex", "kind": "human", "active": True}),
        ("thread.upserted", {"thread_id": "t1", "space_id": "s1"}),
        ("member.added", {"user_id": "alex", "scope_id": "s1"}),
        ("thread.followed", {"user_id": "alex", "thread_id": "t1", "level": "all"}),
    ]
    messages = [message("t1", n) for n in range(1, 1000)]
    prepare(database_url, [*setup, *messages[:500], POISON_MESSAGE, *messages[500:]])
    metrics = Metrics()
    consumer = new_round(database_url, metrics)
    with caplog.at_level(logging.WARNING, logger="bothy"):
        await consume_all(consumer, database_url)
    assert consumer.dead_lettered == 1
    assert metrics.events_consumed._value.get() == len(setup) + 999
    decided = jobs(database_url)
    assert sum(decided.values()) == 999 and set(decided.values()) == {1}
    failed_rounds = [r for r in caplog.records if "isolating" in r.getMessage()]
    assert len(failed_rounds) <= 2 * 9  # about two rounds per halving of a 500-event batch
