"""record_messages: a thread's last_message_seq only rises, and a thread never seen
is created by its first message."""

from __future__ import annotations

import psycopg

from bothy_notify.store.projections import record_messages


def last_seqs(conn: psycopg.Connection) -> dict[str, int]:
    rows = conn.execute("SELECT thread_id, last_message_seq FROM bothy.threads").fetchall()
    return {r[0]: r[1] for r in rows}


def test_a_message_raises_its_threads_sequence_and_creates_unknown_threads(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO bothy.threads (thread_id, space_id, last_message_seq)"
            " VALUES ('t1', 's1', 5), ('t2', 's1', 9)"
        )
        record_messages(conn, [("t1", 6), ("t1", 8), ("t1", 7), ("t2", 3), ("t3", 2)])

        assert last_seqs(conn) == {"t1": 8, "t2": 9, "t3": 2}
        (space,) = conn.execute("SELECT space_id FROM bothy.threads WHERE thread_id = 't1'")
        assert space == ("s1",)  # the rest of a known thread is left as it was


def test_recording_the_same_messages_again_changes_nothing(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        record_messages(conn, [("t1", 4), ("t2", 1)])
        record_messages(conn, [("t1", 4), ("t2", 1)])

        assert last_seqs(conn) == {"t1": 4, "t2": 1}
