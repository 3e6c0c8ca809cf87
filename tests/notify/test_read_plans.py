"""The round's and the job checks' reads reach their tables by key, whatever the key
count: no plan scans a table whole (but the one-row-per-node ``nodes``), for one key
or thousands, as first planned with the keys bound and as the generic plan a
prepared statement comes to. Tables are sized so that the planner would scan them
given a plain join on the keys (see ``notify/facts.py`` on the forms)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from bothy_notify.notify import facts
from bothy_notify.store import deletions, marks, quiet, registrations, unread
from bothy_notify.store import jobs as queue
from bothy_notify.store.projections import record_messages

NOW = datetime(2026, 12, 1, tzinfo=UTC)
NODE = "01900000-0000-7000-8000-000000000001"
TINY = {"nodes"}
"""A row per running node: scanned as cheaply as probed."""

SEED = [
    "INSERT INTO bothy.users (user_id, kind, active)"
    " SELECT 'u' || i, 'human', true FROM generate_series(0, 19999) i",
    "INSERT INTO bothy.preferences (user_id, categories)"
    """ SELECT 'u' || i, '{"mentions": false}' FROM generate_series(0, 19999, 10) i""",
    "INSERT INTO bothy.quiet_hours (user_id, doc, updated_at)"
    """ SELECT 'u' || i, '{"time_zone": "UTC", "schedule": [], "snooze_until": null,"""
    """ "breakthrough": []}', now() FROM generate_series(0, 19999, 10) i""",
    "INSERT INTO bothy.held_pushes (user_id, item, thread_id, seq, category, held_at)"
    " SELECT 'u' || i, 't' || (i % 10), 't' || (i % 10), 1, 'messages', now()"
    " FROM generate_series(0, 19999, 10) i",
    "INSERT INTO bothy.devices (user_id, device_id, platform, state)"
    " SELECT 'u' || i, 'd' || i, 'ios', 'active' FROM generate_series(0, 19999) i",
    "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
    " created_at, renewed_at)"
    " SELECT 'r' || i, 'u' || i, 'd' || i, 'fake', 'tok' || i, now(), now()"
    " FROM generate_series(0, 19999) i",
    "INSERT INTO bothy.members (scope_id, user_id)"
    " SELECT 's' || (i % 10), 'u' || i FROM generate_series(0, 19999) i",
    "INSERT INTO bothy.threads (thread_id, space_id, channel_id)"
    " SELECT 't' || j, 's' || (j % 10), 'c' || (j % 100) FROM generate_series(0, 4999) j",
    # Five popular threads followed by their whole space, the others by ten people each.
    "INSERT INTO bothy.follows (thread_id, user_id, level)"
    " SELECT 't' || j, 'u' || i, CASE WHEN i % 10 < 2 THEN 'all' ELSE 'mentions' END"
    " FROM generate_series(0, 4) j, generate_series(0, 19999) i WHERE i % 10 = j % 10",
    "INSERT INTO bothy.follows (thread_id, user_id, level)"
    " SELECT 't' || j, 'u' || ((j % 10) + 10 * (j + k)), 'all'"
    " FROM generate_series(5, 4999) j, generate_series(0, 9) k"
    " ON CONFLICT DO NOTHING",
    "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq)"
    " SELECT 'u' || i, 't' || (i % 10), 1 FROM generate_series(0, 19999) i",
    "INSERT INTO bothy.hint_windows (user_id, thread_id, opened_at, closes_at, count,"
    " first_seq, newest_seq, newest_message_id)"
    " SELECT 'u' || i, 't' || (i % 10), now(), now(), 1, 0, 0, 'm'"
    " FROM generate_series(0, 19999, 4) i",
    f"INSERT INTO bothy.nodes (node_id, role, host, pid, started_at, seen_at)"
    f" VALUES ('{NODE}', 'all', 'h', 1, now(), now())",
    "INSERT INTO bothy.presence (user_id, device_id, node_id, platform, focus, idle,"
    " updated_at)"
    f" SELECT 'u' || i, 'desk' || i, '{NODE}', 'macos', '{{}}', false, now()"
    " FROM generate_series(0, 19999, 4) i",
    # Deletions in the popular threads, and push marks of every tenth person's phone.
    "INSERT INTO bothy.deleted_messages (thread_id, message_id, seq, deleted_at)"
    " SELECT 't' || (i % 5), 'm' || i, i, now() FROM generate_series(0, 19999) i",
    "UPDATE bothy.threads SET deleted_at = now() WHERE thread_id IN ('t0', 't1', 't2')",
    "INSERT INTO bothy.push_marks (registration_id, thread_id, user_id, marked_at)"
    " SELECT 'r' || i, 't' || j, 'u' || i, now()"
    " FROM generate_series(0, 19999, 10) i, generate_series(0, 9) j",
    "INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at, state,"
    " finished_at)"
    " SELECT 'notify.push_send', '{}', now(), 5, now(), 'completed', now()"
    " FROM generate_series(1, 20000)",
    "INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)"
    " SELECT 'notify.push_send', '{}', now() - interval '1 hour', 5, now()"
    " FROM generate_series(1, 3000)",
]


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
        conn.execute("ANALYZE")
        yield conn


Sent = list[tuple[str, Any]]


def recorded(conn: psycopg.Connection[Any], sent: Sent) -> None:
    """Make ``conn``'s cursors note what they execute in ``sent``."""

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            sent.append((str(query), params))
            return super().execute(query, params, **kwargs)

    conn.cursor_factory = Recording


def scans(node: dict[str, Any]) -> Iterator[str]:
    if node.get("Node Type") == "Seq Scan" and node["Relation Name"] not in TINY:
        yield node["Relation Name"]
    for child in node.get("Plans", ()):
        yield from scans(child)


def scanned(conn: psycopg.Connection[Any], query: str, params: Any) -> dict[str, list[str]]:
    """Tables scanned whole by the bound plan and by the generic plan of ``query``."""
    conn.cursor_factory = psycopg.Cursor
    with conn.transaction(force_rollback=True):
        bound = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
        converted = PostgresQuery(Transformer(conn))
        converted.convert(query, params)
        generic = conn.execute(b"EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + converted.query).fetchone()
    assert bound is not None and generic is not None
    return {
        "bound": list(scans(bound[0][0]["Plan"])),
        "generic": list(scans(generic[0][0]["Plan"])),
    }


def reads(conn: psycopg.Connection[Any], people: list[str], threads: list[str]) -> Sent:
    """Every read of a group and of the job checks, for these keys, as the code sends them."""
    sent: Sent = []
    recorded(conn, sent)
    with conn.transaction(force_rollback=True):
        record_messages(conn, [(t, 5) for t in threads])
        facts.send_follow_rows(conn, threads)()
        facts.send_candidate_follows(conn, {t: people[:50] for t in threads})()
        facts.load_group(
            conn,
            users=people,
            pairs={t: people for t in threads},
            follows=None,
            with_windows=True,
            presence_since=NOW - timedelta(days=365),
        )
        pairs = {(u, t) for u in people for t in threads[:1]}
        facts.reach_now(conn, pairs | {(people[0], None)})
        facts.send_thread_members(conn, threads)()
        facts.shared_presence(conn, people, NOW - timedelta(days=365))
        deletions.deleted_among(conn, {(t, "m" + u[1:]) for u in people for t in threads[:2]})
        deletions.newest_deleted(conn, threads)
        deletions.deleted_seqs(conn, threads[0], 10, 200, since=NOW - timedelta(days=1))
        marks.queue_removals(conn, threads[0], marks.Clearing(NOW, timedelta(seconds=2), 5))
        marks.take_removed_pending(conn, {("r" + u[1:], threads[0]) for u in people})
        registrations.load(conn, {"r" + u[1:] for u in people})
        unread.unread_of(conn, people)
        unread.badges_of(conn, people)
        unread.unread_listing(conn, people[0], unread.UNREAD_LISTING_MAX)
        quiet.docs_of(conn, people)
        quiet.doc_of(conn, people[0])
        quiet.take_held(conn, people[0])
        quiet.summary_targets(conn, people[0])
        claimed = queue.claim(conn, NOW, 200, timedelta(seconds=60), ["notify.push_send"])
        queue.complete(conn, [j.fence for j in claimed], NOW)
    conn.cursor_factory = psycopg.Cursor
    return sent


@pytest.mark.parametrize(
    ("people", "threads"),
    [
        (["u7"], ["t7"]),  # one message, one recipient
        ([f"u{i}" for i in range(0, 20000, 5)], [f"t{j}" for j in range(5)] + ["t17"]),
    ],
    ids=["one key", "thousands of keys"],
)
def test_no_read_scans_a_table(
    conn: psycopg.Connection[Any], people: list[str], threads: list[str]
) -> None:
    sent = reads(conn, people, threads)
    assert len(sent) >= 26  # every read above was sent (in a pipeline or not)
    found = {}
    for query, params in sent:
        if query.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE")):
            result = scanned(conn, query, params)
            if result["bound"] or result["generic"]:
                found[query[:80]] = result
    assert found == {}
