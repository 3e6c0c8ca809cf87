"""Registrations in the store: the owner scope of the unique key, and two people
registering one device token at the same moment."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import psycopg

from bothy_notify.store import registrations as regs

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WAIT_LIMIT = 10.0
"""Seconds the test waits for the second writer to block before it fails."""


def register(
    conn: psycopg.Connection, user: str, token: str, provider: str = "fcm"
) -> regs.Registered:
    return regs.upsert(
        conn,
        user_id=user,
        device_id="phone",
        provider=provider,
        token=token,
        environment=None,
        app_id=None,
        signing_key=None,
        now=NOW,
        max_per_person=20,
    )


def blocked(watcher: psycopg.Connection, pid: int) -> bool:
    """Whether the backend ``pid`` waits for a lock."""
    row = watcher.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


def test_the_owner_scope_is_the_person_for_webhooks_only() -> None:
    assert regs.owner_scope("webhook", "alex") == "alex"
    assert regs.owner_scope("fcm", "alex") == ""
    assert regs.owner_scope("apns", "alex") == ""


def test_two_people_registering_one_device_token_at_once_leave_it_with_the_later(
    database_url: str,
) -> None:
    with (
        psycopg.connect(database_url) as first,
        psycopg.connect(database_url) as second,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        mine = register(first, "alex", "shared")  # uncommitted: invisible to the second
        result: list[regs.Registered] = []

        def sam_registers() -> None:
            result.append(register(second, "sam", "shared"))
            second.commit()

        sam = threading.Thread(target=sam_registers)
        sam.start()
        # The second writer's insert waits on the first one's unique index entry.
        deadline = time.monotonic() + WAIT_LIMIT
        pid = second.info.backend_pid
        while not blocked(watcher, pid):
            assert time.monotonic() < deadline, "the second writer never waited"
            time.sleep(0.01)
        first.commit()
        sam.join(WAIT_LIMIT)

        (moved,) = result
        assert moved.change is regs.Change.MOVED
        assert moved.registration.id == mine.registration.id
        rows = watcher.execute(
            "SELECT user_id FROM bothy.push_registrations WHERE token = 'shared'"
        ).fetchall()
        assert rows == [("sam",)]


def test_one_webhook_url_of_two_people_is_two_registrations(database_url: str) -> None:
    url = "https://hooks.example.org/in"
    with psycopg.connect(database_url) as conn:
        alex = register(conn, "alex", url, provider="webhook")
        sam = register(conn, "sam", url, provider="webhook")
        again = register(conn, "alex", url, provider="webhook")

    assert (alex.change, sam.change, again.change) == (
        regs.Change.CREATED,
        regs.Change.CREATED,
        regs.Change.REFRESHED,
    )
    assert alex.registration.id != sam.registration.id
    assert again.registration.id == alex.registration.id
