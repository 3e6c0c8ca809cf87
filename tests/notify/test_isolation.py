"""Isolation: API load cannot starve delivery, ``/readyz`` is cheap, and a long
transaction elsewhere makes the round back off instead of spinning."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from bothy_notify.config import LiveConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store.db import Database
from gateway.service import build_gateway
from tests.gateway.client import GatewayClient, gateway_of, identify, wait_until
from tests.harness import Launch, device_token, ev, make_config, wait_for


def outbox(url: str, *events: tuple[str, dict[str, Any]]) -> None:
    with psycopg.connect(url) as conn:
        for type_, payload in events:
            conn.execute("SELECT bothy.append_event(%s, %s::jsonb)", (type_, json.dumps(payload)))


def waiting_on_a_lock(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_starved_api_pool_does_not_hold_up_delivery(
    launch: Launch, database_url: str
) -> None:
    node = await launch(config=make_config(database={"pool_size": 2}))
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "phone", "tok")
    await node.settle()
    assert node.daemon.jobs_db is not None and node.daemon.jobs_db is not node.db

    # Every connection of the API pool waits on a lock another session holds (an
    # advisory lock: it gives that session no transaction id, so it blocks nothing else).
    gate = psycopg.connect(database_url, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(4242)")
    try:
        async with trio.open_nursery() as stuck:
            try:
                for _ in range(node.db.pool_size):
                    stuck.start_soon(
                        node.db.run, lambda c: c.execute("SELECT pg_advisory_xact_lock(4242)")
                    )
                await wait_for(
                    lambda: _at_least(waiting_on_a_lock, database_url, node.db.pool_size),
                    what="the API pool to be taken",
                )
                # The producer appends through its own transaction (outbox); the round,
                # the runner and the provider need nothing from the API pool.
                outbox(
                    database_url,
                    (
                        "message.created",
                        {
                            "thread_id": "t1",
                            "message_id": "m1",
                            "thread_seq": 1,
                            "author_id": "sam",
                        },
                    ),
                )
                await wait_for(lambda: _true(len(node.fake.sends) == 1), what="the push")
                assert await trio.to_thread.run_sync(waiting_on_a_lock, database_url) == 2
            finally:
                gate.execute("SELECT pg_advisory_unlock(4242)")
    finally:
        gate.close()


async def test_readiness_pings_are_shared_and_cached_for_a_second(
    database_url: str, mock_clock: trio.testing.MockClock
) -> None:
    db = Database(database_url, pool_size=2)
    await db.open()
    try:
        answers: list[bool] = []

        async def ask() -> None:
            answers.append(await db.ping())

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(ask)
        assert answers == [True] * 20 and db.pings == 1
        mock_clock.jump(0.9)
        assert await db.ping() and db.pings == 1
        mock_clock.jump(0.2)
        assert await db.ping() and db.pings == 2
    finally:
        await db.close()


async def test_readyz_does_not_ping_the_database_on_every_call(launch: Launch) -> None:
    node = await launch()
    before = node.db.pings
    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(node.request, "GET", "/readyz")
    assert node.db.pings - before <= 2  # one per second at most, and these took less


def new_round(url: str, clock: FakeClock, metrics: Metrics) -> ConsumerRound:
    return ConsumerRound(
        database_url=url,
        config=LiveConfig(make_config(notify={"poll_interval": "80ms"})),
        clock=clock,
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=metrics,
    )


def cursor_seq(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT seq FROM bothy.consumer_cursor").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_a_long_transaction_elsewhere_makes_the_round_back_off(
    database_url: str, ending: str
) -> None:
    clock, metrics = FakeClock(), Metrics()
    consumer = new_round(database_url, clock, metrics)
    # A transaction with an id, held open on another connection (as a producer's
    # slow outbox transaction, or anything else in the cluster).
    blocker = psycopg.connect(database_url, autocommit=False)
    blocker.execute("SELECT pg_current_xact_id()")
    try:
        outbox(
            database_url, ("user.upserted", {"user_id": "alex", "kind": "human", "active": True})
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(consumer.run)
            await wait_for(lambda: _true(len(consumer.blocked_waits) >= 8), what="backing off")
            waits = list(consumer.blocked_waits)[:8]
            assert waits == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.08, 0.08, 0.08])
            assert await trio.to_thread.run_sync(cursor_seq, database_url) == 0

            clock.advance(30)
            await wait_for(
                lambda: _true(metrics.consumer_blocked_seconds._value.get() >= 30),
                what="the blocked gauge",
            )
            getattr(blocker, ending)()
            await wait_for(
                lambda: _at_least(cursor_seq, database_url, 1), what="the event after the wait"
            )
            await wait_for(
                lambda: _true(metrics.consumer_blocked_seconds._value.get() == 0),
                what="the gauge back at 0",
            )
            nursery.cancel_scope.cancel()
    finally:
        blocker.close()


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


async def _at_least(fn: Any, url: str, n: int) -> bool:
    return bool(await trio.to_thread.run_sync(fn, url) >= n)


async def test_a_busy_gateway_pool_does_not_hold_up_http_requests(
    launch: Launch, database_url: str, nursery: trio.Nursery
) -> None:
    """The gateway's database work has a pool of its own: with all of it taken (as a
    flood of gateway ops would take it), an HTTP request is answered at once, and
    the gateway's own work waits for its share."""
    node = await launch(gateway_factory=build_gateway, config=make_config())
    gateway_db = node.daemon.gateway_db
    assert gateway_db is not None and gateway_db is not node.db
    gate = psycopg.connect(database_url, autocommit=True)
    gate.execute("SELECT pg_advisory_lock(4343)")
    try:
        async with trio.open_nursery() as stuck:
            try:
                for _ in range(gateway_db.pool_size):
                    stuck.start_soon(
                        gateway_db.run, lambda c: c.execute("SELECT pg_advisory_xact_lock(4343)")
                    )
                await wait_for(
                    lambda: _at_least(waiting_on_a_lock, database_url, gateway_db.pool_size),
                    what="the gateway pool to be taken",
                )
                assert node.addresses.gateway is not None
                desktop = await GatewayClient.connect(nursery, node.addresses.gateway)
                await identify(desktop, device_token("alex", "alex-desktop", "macos"))
                await wait_until(lambda: gateway_of(node).hub.statistics().catching_up == 1)

                with trio.fail_after(5):
                    answer = await node.request(
                        "GET", "/v1/preferences", token=device_token("sam", "sam-phone")
                    )

                assert answer.status_code == 200
                assert all(f.get("op") != "catchup.complete" for f in desktop.frames)
            finally:
                gate.execute("SELECT pg_advisory_unlock(4343)")
        await desktop.wait_op("catchup.complete")
    finally:
        gate.close()
