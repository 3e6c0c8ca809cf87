"""A server that is not the primary any more, on the real embedded PostgreSQL.

After a failover the old primary may come back as a standby (Patroni demotes it):
a connection still open to it has every write refused as read-only (SQLSTATE
25006), and a new connection must not land on it. Here the session's server plays
the demoted one: a session made read-only (``default_transaction_read_only``)
refuses writes as a standby would, and a database made read-only refuses a
connection that asks for a server that takes writes.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import trio
from psycopg.conninfo import make_conninfo

from bothy_notify.store.db import Database, StoreUnavailable, connect_dedicated
from bothy_notify.store.servers import SERVERS, not_the_primary

PID = "SELECT pg_backend_pid()"


async def test_a_pooled_write_refused_as_read_only_is_unavailable_and_retried_on_a_new_connection(
    pg_url: str,
) -> None:
    db = Database(pg_url, pool_size=1)
    await db.open()
    try:
        pid = await db.run(lambda c: c.execute(PID).fetchall(), transaction=False)

        def write_on_a_demoted_server(conn: psycopg.Connection[object]) -> None:
            conn.execute("SET default_transaction_read_only = on")
            conn.execute("CREATE TABLE bothy_never_made ()")

        with trio.fail_after(10), pytest.raises(StoreUnavailable) as caught:
            await db.run(write_on_a_demoted_server, transaction=False)

        assert isinstance(caught.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        assert not db.unreachable  # the server answered: no fail-fast for the pool
        with trio.fail_after(10):
            again = await db.run(lambda c: c.execute(PID).fetchall(), transaction=False)
            # The retry got a new connection, one that takes writes.
            await db.run(lambda c: c.execute("CREATE TEMPORARY TABLE made ()"))
        assert again != pid
    finally:
        await db.close()


async def test_a_direct_write_refused_as_read_only_is_unavailable_and_reconnects(
    pg_url: str,
) -> None:
    db = Database(pg_url, pool_size=1)
    await db.open()
    try:
        with trio.fail_after(10):
            pid = await db.query_direct(b"pid", PID.encode(), [])
            await db.query_direct(
                b"demote", b"SELECT set_config('default_transaction_read_only', 'on', false)", []
            )
            with pytest.raises(StoreUnavailable) as caught:
                await db.query_direct(b"write", b"CREATE TABLE bothy_never_made ()", [])
            assert getattr(caught.value.__cause__, "sqlstate", None) == "25006"

            assert await db.query_direct(b"pid", PID.encode(), []) != pid
            assert db.direct.statements == 3  # the refused write counts for nothing
    finally:
        await db.close()


@pytest.fixture
def read_only_url(database_url: str, pg_url: str) -> Iterator[str]:
    """This test's database, read-only for every new session (as a standby is)."""
    name = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    yield database_url


async def test_a_new_connection_asks_for_a_server_that_takes_writes(read_only_url: str) -> None:
    def connect(url: str) -> object:
        conn = connect_dedicated(url)
        conn.close()
        return conn

    with trio.fail_after(10):
        with pytest.raises(StoreUnavailable):
            await trio.to_thread.run_sync(connect, read_only_url)
        # The URL may say otherwise (a read-only tool pointed at a standby).
        await trio.to_thread.run_sync(
            connect, make_conninfo(read_only_url, target_session_attrs="any")
        )


def test_what_says_a_server_is_not_the_primary() -> None:
    for sqlstate in ("25006", "57P01", "57P02", "57P03", "08006", "08003"):
        assert not_the_primary(psycopg.errors.lookup(sqlstate)())
    for sqlstate in ("23505", "57014", "40001", "42P01"):
        assert not not_the_primary(psycopg.errors.lookup(sqlstate)())
    assert not not_the_primary(ValueError())


def test_a_lost_server_is_tried_last_until_a_connection_to_it_succeeds() -> None:
    hosts = [{"host": "pg1", "port": "5432"}, {"host": "pg2", "port": "5432"}]
    lost = ("pg1", "5432")
    try:
        assert SERVERS.lost(lost)
        assert not SERVERS.lost(lost)  # not news: nobody drops anything again
        assert [a["host"] for a in SERVERS.attempts(hosts)] == ["pg2", "pg1"]
    finally:
        SERVERS.connected(lost)
    assert [a["host"] for a in SERVERS.attempts(hosts)] == ["pg1", "pg2"]
