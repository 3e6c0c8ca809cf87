"""Every wait on a frozen PostgreSQL is bounded.

A frozen server (SIGSTOP, a hung host, a network split) accepts connections and
never answers. The server here is the session's embedded one reached through
proxies on 127.0.0.1 (:mod:`tests.support.frozen`) that stop forwarding on
command; a multi-host URL puts a proxy to freeze first and a working one second.
Each test shows a call failing, or moving to the next host, within its bound
(``[database]``'s keys, small here) plus :data:`SLACK`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store.db import (
    PROBE_EVERY,
    Database,
    DatabaseTimeouts,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    connect_dedicated,
)
from bothy_notify.store.listen import Listener, Listening, delivering, reconnect_backoff
from bothy_notify.store.servers import SERVERS
from gateway.hub import Hub
from gateway.service import build_gateway
from gateway.shared_presence import SharedPresencePublisher
from tests.cluster.support import cluster_config, connect, registry
from tests.harness import Node, ev, start_node, wait_for
from tests.support.frozen import FreezableProxy, start_proxies, through

RESPONSE = 1.0
"""The tests' ``database.response_timeout``."""

BOUNDS = DatabaseTimeouts(
    connect=2.0,  # libpq's least
    tcp_user=10.0,
    statement=0.5,
    response=RESPONSE,
    listen_check=0.5,
    health_check=0.5,
)
"""The tests' ``[database]`` bounds: short, so a frozen server costs seconds."""

SLACK = 1.5
"""Seconds a bounded call may take past its bound on a shared, busy machine."""


async def elapsed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Seconds ``call()`` took, and its result or the store error it raised."""
    started = time.monotonic()
    try:
        result: Any = await call()
    except StoreError as exc:
        result = exc
    return time.monotonic() - started, result


async def select_one(db: Database) -> int:
    rows = await db.run(lambda c: c.execute("SELECT 1").fetchall(), transaction=False)
    return int(rows[0][0])


async def answered(db: Database, timeout: float) -> float:
    """Seconds until ``db`` answers again (failing fast while it is unreachable)."""
    started = time.monotonic()
    with trio.fail_after(timeout):
        while True:
            try:
                await select_one(db)
                return time.monotonic() - started
            except StoreUnavailable:
                await trio.sleep(0.05)


@pytest.fixture
async def hosts(pg_url: str, nursery: trio.Nursery) -> list[FreezableProxy]:
    """Two proxies in front of the session's server: the first to freeze, the second
    the host that takes over. (Tests that need no table use the server's own
    database, ``pg_url``: no database to clone.) What earlier tests found lost is
    forgotten: a new proxy may listen on a port an earlier one had."""
    SERVERS.forget()
    return await start_proxies(nursery, pg_url, 2)


async def test_a_new_connection_skips_a_frozen_host_within_connect_timeout(
    pg_url: str, hosts: list[FreezableProxy]
) -> None:
    frozen, live = hosts
    frozen.freeze()
    url = through(pg_url, frozen, live)

    took, conn = await elapsed(
        partial(trio.to_thread.run_sync, partial(connect_dedicated, url, timeouts=BOUNDS))
    )

    assert not isinstance(conn, StoreError)
    conn.close()
    assert BOUNDS.connect <= took < BOUNDS.connect + SLACK
    assert (frozen.connections, live.connections) == (1, 1)


async def test_statements_on_a_frozen_server_fail_within_response_timeout_then_fail_over(
    pg_url: str, hosts: list[FreezableProxy]
) -> None:
    first, second = hosts
    db = Database(through(pg_url, first, second), pool_size=2, timeouts=BOUNDS)
    await db.open()
    direct_one = partial(db.direct.query, b"one", b"SELECT 1", [])
    try:
        assert await select_one(db) == 1
        assert await direct_one() == [[b"1"]]
        first.freeze()

        direct_took, direct = await elapsed(direct_one)

        assert isinstance(direct, StoreTimeout)
        assert RESPONSE <= direct_took < RESPONSE + SLACK
        # The server was found lost on one connection: the pool dropped its own at
        # once, and new connections try the second host first. No wait, no timeout.
        pooled_took, pooled = await elapsed(partial(select_one, db))
        assert pooled == 1 and pooled_took < SLACK
        assert await direct_one() == [[b"1"]]
        assert second.connections >= 2
    finally:
        await db.close()


async def test_a_frozen_server_found_by_one_pool_is_left_by_every_pool_at_once(
    pg_url: str, hosts: list[FreezableProxy]
) -> None:
    """Connections to the frozen server that nobody used since the freeze (another
    pool's, a direct connection) are dropped the moment any connection finds it lost:
    none costs its next caller ``response_timeout``, and no new connection tries the
    frozen host while another answers."""
    first, second = hosts
    url = through(pg_url, first, second)
    api = Database(url, pool_size=2, name="api", timeouts=BOUNDS)
    jobs = Database(url, pool_size=2, name="jobs", timeouts=BOUNDS)
    await api.open()
    await jobs.open()
    try:
        for db in (api, jobs):
            assert await select_one(db) == 1
            assert await db.query_direct(b"one", b"SELECT 1", []) == [[b"1"]]
        assert second.connections == 0
        first.freeze()
        attempts = first.connections

        took, error = await elapsed(partial(select_one, api))
        assert isinstance(error, StoreTimeout) and RESPONSE <= took < RESPONSE + SLACK

        took, answer = await elapsed(partial(select_one, jobs))
        assert answer == 1 and took < SLACK
        took, rows = await elapsed(partial(jobs.query_direct, b"one", b"SELECT 1", []))
        assert rows == [[b"1"]] and took < SLACK
        assert not jobs.unreachable
        assert first.connections == attempts  # the frozen host was not tried again
    finally:
        first.thaw()
        await api.close()
        await jobs.close()


async def test_a_pool_answering_again_wakes_those_waiting_to_retry(pg_url: str) -> None:
    """A service whose statement found the database unavailable (the runner's claim,
    the presence publisher's write) waits for the pool's next success, not a whole
    retry interval (:meth:`Database.answer_after`)."""
    db = Database(pg_url, pool_size=2, timeouts=BOUNDS)
    await db.open()
    try:
        failed_at = trio.current_time()
        woken: list[float] = []

        async def retry_later() -> None:
            await db.answer_after(failed_at, 60)
            woken.append(trio.current_time())

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(retry_later)
                await trio.testing.wait_all_tasks_blocked()
                assert woken == []
                await select_one(db)
        assert woken and woken[0] - failed_at < 5
        # Nothing answered after ``since``: it waits its whole ``at_most``.
        took, _ = await elapsed(partial(db.answer_after, trio.current_time(), 0.2))
        assert 0.2 <= took < 0.2 + SLACK
    finally:
        await db.close()


async def test_a_cancelled_statement_returns_its_result_and_keeps_its_connection(
    pg_url: str,
) -> None:
    """One rule on both paths: a statement once sent is waited for; the cancellation
    comes at the caller's next checkpoint, and the connection stays."""
    db = Database(pg_url, pool_size=1, timeouts=BOUNDS)
    await db.open()
    try:
        await _cancelled_statements(db)
    finally:
        await db.close()


async def _cancelled_statements(db: Database) -> None:
    sleep_then_pid = b"SELECT pg_sleep(0.3)::text, pg_backend_pid()::text"
    pid = (await db.query_direct(b"pid", b"SELECT pg_backend_pid()::text", []))[0][0]
    got: list[Any] = []

    with trio.move_on_after(0.05) as direct_scope:
        got.append(await db.query_direct(b"sleep", sleep_then_pid, []))
        await trio.lowlevel.checkpoint()  # the cancellation arrives here
        got.append("not reached")
    with trio.move_on_after(0.05) as pooled_scope:
        got.append(await db.run(lambda c: c.execute("SELECT pg_sleep(0.3), 2").fetchall()))
        await trio.lowlevel.checkpoint()
        got.append("not reached")

    assert direct_scope.cancelled_caught and pooled_scope.cancelled_caught
    assert got == [[[b"", pid]], [("", 2)]]
    assert await db.query_direct(b"pid", b"SELECT pg_backend_pid()::text", []) == [[pid]]
    assert db.direct.statements == 3


async def test_a_slow_statement_is_ended_by_the_server_and_its_connection_kept(
    pg_url: str,
) -> None:
    db = Database(pg_url, pool_size=1, timeouts=BOUNDS)
    await db.open()
    try:
        pid = await db.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchall())

        took, error = await elapsed(partial(db.run, lambda c: c.execute("SELECT pg_sleep(5)")))

        # The server could not do it in time: unavailable, but not a lost server.
        assert isinstance(error, StoreUnavailable) and not isinstance(error, StoreTimeout)
        assert type(error.__cause__).__name__ == "QueryCanceled"
        assert not db.unreachable
        assert BOUNDS.statement <= took < RESPONSE
        assert await db.run(lambda c: c.execute("SELECT pg_backend_pid()").fetchall()) == pid
    finally:
        await db.close()


async def test_bulk_work_may_take_longer_than_the_bounds(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, timeouts=BOUNDS)
    await db.open()
    try:
        longer = RESPONSE + 0.2
        rows = await db.run(
            lambda c: c.execute("SELECT pg_sleep(%s), 1", (longer,)).fetchall(), bulk=True
        )
        assert rows == [("", 1)]
    finally:
        await db.close()


async def test_the_readiness_ping_of_a_frozen_server_says_false_within_its_bound(
    pg_url: str, hosts: list[FreezableProxy]
) -> None:
    frozen = hosts[0]
    db = Database(through(pg_url, frozen), pool_size=2, timeouts=BOUNDS)
    await db.open()
    try:
        assert await db.ping(share=False)
        frozen.freeze()

        took, ok = await elapsed(partial(db.ping, share=False))

        assert ok is False
        assert took < 2 * BOUNDS.health_check + SLACK
    finally:
        await db.close()


async def test_a_listener_on_a_frozen_server_reconnects_to_the_next_host(
    pg_url: str, hosts: list[FreezableProxy], nursery: trio.Nursery
) -> None:
    first, second = hosts
    got: list[str] = []
    connected = trio.Event()

    async def serve(listening: Listening) -> None:
        await listening.listen()
        connected.set()
        while True:
            got.extend(n.payload for n in await listening.wait())

    listener = Listener(
        through(pg_url, first, second),
        ["bothy_frozen_test"],
        name="test",
        reconnect=reconnect_backoff(0.1),
        timeouts=BOUNDS,
    )
    await nursery.start(listener.run, serve)
    assert listener.statistics().connections == 1
    connected = trio.Event()
    first.freeze()
    started = time.monotonic()

    with trio.fail_after(10):
        await connected.wait()

    took = time.monotonic() - started
    # Noticed within the idle check and the bound on its answer, then one attempt at
    # the frozen host and the second host answers.
    assert took < BOUNDS.listen_check + RESPONSE + BOUNDS.connect + SLACK
    assert listener.statistics().connections == 2
    direct = Database(pg_url, pool_size=1)
    await direct.open()
    try:
        await direct.run(lambda c: c.execute("NOTIFY bothy_frozen_test, 'after'"))
    finally:
        await direct.close()
    with trio.fail_after(5):
        while got != ["after"]:
            await trio.sleep(0.01)


async def test_a_presence_write_to_a_frozen_server_fails_within_its_bound_and_says_so(
    database_url: str, hosts: list[FreezableProxy], nursery: trio.Nursery
) -> None:
    first, second = hosts  # in front of the same server: this test's database is on it
    clock = FakeClock()
    metrics = Metrics()
    db = Database(through(database_url, first, second), pool_size=2, wait=5, timeouts=BOUNDS)
    await db.open()
    try:
        hub = Hub(metrics=metrics, outbound_queue_max=4)
        reg = registry(db, clock, "api")
        await reg.beat()
        publisher = SharedPresencePublisher(
            hub=hub, db=db, node_id=reg.node_id, clock=clock, metrics=metrics, wait_limit=10
        )
        await nursery.start(publisher.run)

        def healthy() -> bool:
            return publisher.healthy

        await publisher.wait_published()
        assert healthy()
        first.freeze()
        started = time.monotonic()

        connect(hub, "alex", "alex-desktop")  # a change to publish
        with trio.fail_after(RESPONSE + SLACK):
            while healthy():
                await trio.sleep(0.01)
        assert time.monotonic() - started >= RESPONSE
        # The next attempts go to the second host: published, healthy again.
        with trio.fail_after(PROBE_EVERY + BOUNDS.connect + SLACK + 1):
            await publisher.wait_published()
            while not healthy():
                await trio.sleep(0.01)
        assert publisher.statistics()["pending"] == 0
    finally:
        first.thaw()  # a quick close: a connection attempt waiting on it ends now
        await db.close()


async def test_a_node_on_a_multi_host_url_rides_out_a_frozen_host(
    database_url: str, hosts: list[FreezableProxy], nursery: trio.Nursery
) -> None:
    """The round's and the runner's sessions, the pools and ``/readyz`` together: the
    node says it is not ready (never hanging on the question), is ready again through
    the second host, and delivers."""
    first, second = hosts
    bounds = {
        "connect_timeout": "2s",
        "response_timeout": f"{RESPONSE}s",
        "statement_timeout": f"{BOUNDS.statement}s",
        "listen_check_interval": f"{BOUNDS.listen_check}s",
        "health_check_timeout": f"{BOUNDS.health_check}s",
    }
    config = cluster_config("all", database=bounds)
    node = await start_node(
        nursery, through(database_url, first, second), config=config, gateway_factory=build_gateway
    )
    async with node.http:
        try:
            await _ride_out(node, database_url, first, second)
        finally:
            first.thaw()  # a quick teardown: what waited on it ends now


async def _ride_out(
    node: Node, database_url: str, first: FreezableProxy, second: FreezableProxy
) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "phone", "tok")
    await wait_for(partial(readiness, node, 200), what="ready")
    first.freeze()
    frozen_at = time.monotonic()
    # A promoted server holds none of the old primary's sessions, nor the round's
    # advisory lock. Both hosts are one server here: end the sessions that went
    # through the frozen host (the second has carried none yet).
    assert second.connections == 0
    await end_other_sessions(database_url)

    await wait_for(partial(readiness, node, 503), timeout=5, what="not ready")
    not_ready = time.monotonic() - frozen_at
    await wait_for(partial(readiness, node, 200), timeout=15, what="ready again")
    ready_again = time.monotonic() - frozen_at
    await node.append(
        ev("message.created", thread_id="t1", message_id="m1", thread_seq=1, author_id="sam")
    )
    await wait_for(partial(pushed, node), timeout=5, what="the push")

    # Noticed by the first health check after the freeze; ready again once the round
    # and the listeners noticed too (listen_check + response), reconnected past the
    # frozen host (connect), and the pools refilled.
    assert not_ready < RESPONSE + 2 * BOUNDS.health_check + SLACK
    assert ready_again < BOUNDS.listen_check + RESPONSE + 2 * BOUNDS.connect + 2 * SLACK


async def readiness(node: Node, status: int) -> bool:
    """Whether ``/readyz`` answers ``status``; every answer comes within its bound."""
    started = time.monotonic()
    answer = await node.request("GET", "/readyz")
    assert time.monotonic() - started < 2 * BOUNDS.health_check + SLACK
    return answer.status_code == status


async def pushed(node: Node) -> bool:
    await trio.lowlevel.checkpoint()
    return len(node.fake.sends) >= 1


async def end_other_sessions(url: str) -> None:
    def end() -> None:
        conn = connect_dedicated(url)
        try:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            conn.close()

    await trio.to_thread.run_sync(end)


async def test_a_listener_waiting_to_reconnect_tries_at_once_when_another_connection_gets_through(
    pg_url: str, nursery: trio.Nursery
) -> None:
    """After a failover the first connection of the process to reach the new primary
    (a pool's, say) ends every listener's backoff: they need not wait up to its cap."""
    backoff = 60.0
    listener = Listener(
        pg_url,
        ["bothy_frozen_test"],
        name="test",
        reconnect=reconnect_backoff(backoff),
        timeouts=BOUNDS,
    )
    await nursery.start(listener.run, delivering(lambda _: None))
    assert listener.statistics().connections == 1
    await end_other_sessions(pg_url)  # the listener's session among them
    with trio.fail_after(5):
        while listener.statistics().reconnect_wait is None:
            await trio.sleep(0.01)
    assert listener.statistics().reconnect_wait == backoff

    conn = await trio.to_thread.run_sync(partial(connect_dedicated, pg_url))
    conn.close()

    with trio.fail_after(5):
        while listener.statistics().connections < 2:
            await trio.sleep(0.01)
