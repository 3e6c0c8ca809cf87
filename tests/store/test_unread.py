"""The unread listing: its cut is the statement's ``LIMIT`` and its badge a count, both
the set :func:`~bothy_notify.store.unread.unread_of` lists (issue 30)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from bothy_notify.store.unread import UnreadThread, unread_listing, unread_of

SEED = [
    "INSERT INTO bothy.users (user_id, kind, active) VALUES ('alex', 'human', true),"
    " ('sam', 'human', true)",
    "INSERT INTO bothy.members (scope_id, user_id) VALUES ('s', 'alex'), ('s', 'sam')",
    "INSERT INTO bothy.threads (thread_id, space_id, last_message_seq)"
    " SELECT 't' || lpad(j::text, 3, '0'), 's', 5 FROM generate_series(0, 39) j",
    # alex follows all 40, has read 10 of them; sam follows none.
    "INSERT INTO bothy.follows (thread_id, user_id, level)"
    " SELECT 't' || lpad(j::text, 3, '0'), 'alex', 'all' FROM generate_series(0, 39) j",
    "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq)"
    " SELECT 'alex', 't' || lpad(j::text, 3, '0'), 5 FROM generate_series(0, 39, 4) j",
    "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq) VALUES ('alex', 't001', 3)",
]


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
        yield conn


@pytest.mark.parametrize("limit", [0, 1, 7, 30, 1000])
def test_the_listing_is_the_first_threads_and_the_badge_counts_them_all(
    conn: psycopg.Connection[Any], limit: int
) -> None:
    everything = unread_of(conn, ["alex"])["alex"]
    assert len(everything) == 30

    badge, threads = unread_listing(conn, "alex", limit)

    assert badge == 30
    assert threads == everything[:limit]
    # t000 is read; t001 read up to 3 of 5.
    assert limit == 0 or threads[0] == UnreadThread("t001", unread=2, last_read_seq=3)


def test_the_statement_sends_at_most_the_limit(conn: psycopg.Connection[Any]) -> None:
    """The cut is in SQL: the rows that come back are the listing, never all unread."""
    sent: list[int] = []

    class Counting(psycopg.Cursor[Any]):
        def fetchall(self) -> list[Any]:
            rows = super().fetchall()
            sent.append(len(rows))
            return rows

    conn.cursor_factory = Counting
    badge, threads = unread_listing(conn, "alex", 3)
    assert (badge, len(threads), sent) == (30, 3, [3])


def test_a_person_without_unread_threads_has_badge_zero(conn: psycopg.Connection[Any]) -> None:
    assert unread_listing(conn, "sam", 1000) == (0, [])
    assert unread_listing(conn, "nobody", 1000) == (0, [])
