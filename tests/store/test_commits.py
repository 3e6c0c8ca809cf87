"""Which connections commit without waiting for the WAL flush (``synchronous_commit =
off``): only those whose writes the daemon redoes after a server crash (the round's
transactions, the runner's completions), never the appends a ``200`` answers for.

Each test reads the session's setting on the connection itself, on the real embedded
PostgreSQL.
"""

from __future__ import annotations

import pytest

from bothy_notify.kernel.backoff import Backoff
from bothy_notify.store.connection import Conn, connect_dedicated
from bothy_notify.store.db import Database
from bothy_notify.store.listen import Listener, Listening
from tests.harness import Launch

SETTING = b"SELECT current_setting('synchronous_commit')"


def synchronous_commit(conn: Conn) -> str:
    row = conn.execute(SETTING.decode()).fetchone()
    assert row is not None
    return str(row[0])


async def direct_setting(db: Database) -> str:
    rows = await db.query_direct(b"bothy_test_synchronous_commit", SETTING, [])
    assert rows[0][0] is not None
    return rows[0][0].decode()


def test_a_dedicated_connection_commits_synchronously_by_default(database_url: str) -> None:
    conn = connect_dedicated(database_url)
    try:
        assert synchronous_commit(conn) == "on"
    finally:
        conn.close()


def test_an_asynchronous_commit_connection_turns_the_flush_wait_off_for_itself(
    database_url: str,
) -> None:
    relaxed = connect_dedicated(database_url, asynchronous_commit=True)
    other = connect_dedicated(database_url)
    try:
        assert synchronous_commit(relaxed) == "off"
        assert synchronous_commit(other) == "on"
    finally:
        relaxed.close()
        other.close()


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_listener_connection_commits_as_its_service_asks(
    database_url: str, asynchronous: bool
) -> None:
    listener = Listener(
        database_url,
        ("bothy_commit_test",),
        name="test",
        reconnect=Backoff(initial=0.05, cap=0.05),
        asynchronous_commit=asynchronous,
    )
    seen: list[str] = []

    async def serve(listening: Listening) -> None:
        seen.append(await listening.run(synchronous_commit))

    await listener.run(serve)
    assert seen == ["off" if asynchronous else "on"]


async def test_only_the_direct_connection_of_a_database_so_made_commits_asynchronously(
    database_url: str,
) -> None:
    jobs = Database(database_url, pool_size=2, name="jobs", direct_asynchronous_commit=True)
    api = Database(database_url, pool_size=2, name="api")
    await jobs.open()
    await api.open()
    try:
        assert await direct_setting(jobs) == "off"
        assert await jobs.run(synchronous_commit) == "on"  # the pool keeps the default
        assert await direct_setting(api) == "on"
    finally:
        await jobs.close()
        await api.close()


async def test_the_daemon_appends_durably_and_completes_jobs_asynchronously(
    launch: Launch,
) -> None:
    node = await launch()
    # The API's direct connection carries every append a 200 answers for.
    assert node.daemon.db is not None
    assert await direct_setting(node.daemon.db) == "on"
    jobs_db = node.daemon.jobs_db
    assert jobs_db is not None
    # The jobs pool's direct connection only completes jobs.
    assert await direct_setting(jobs_db) == "off"
    assert await jobs_db.run(synchronous_commit) == "on"
