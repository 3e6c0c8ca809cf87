"""A device holds one connection in a cluster as on one node (SPEC section 8.6): when
it goes live on a second node, its older connection on the first closes with 4017.

Each node here is a hub, its registry row, its shared presence publisher and its
revocation listener on the test's database, as ``gateway.service`` wires them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
import trio

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.store import cluster
from bothy_notify.store.db import Database, connect_dedicated
from gateway.closes import REPLACED, Close
from gateway.connection import Connection
from gateway.hub import Hub
from gateway.protocol import Phase
from gateway.revocations import RevocationListener, replaced_connection
from gateway.shared_presence import SharedPresencePublisher
from tests.cluster.support import connect, presence_rows, registry


@dataclass
class Node:
    hub: Hub
    node_id: str
    publisher: SharedPresencePublisher


NodeFactory = Callable[[], Awaitable[Node]]


@pytest.fixture
async def nodes(
    db: Database, database_url: str, clock: FakeClock, nursery: trio.Nursery
) -> AsyncIterator[NodeFactory]:
    async def start() -> Node:
        metrics = Metrics()
        hub = Hub(metrics=metrics, outbound_queue_max=4)
        reg = registry(db, clock, "api")
        await reg.beat()
        publisher = SharedPresencePublisher(
            hub=hub, db=db, node_id=reg.node_id, clock=clock, metrics=metrics, wait_limit=10
        )
        await nursery.start(publisher.run)
        listener = RevocationListener(
            database_url=database_url,
            hub=hub,
            retry_interval=timedelta(milliseconds=50),
            node_id=reg.node_id,
        )
        await nursery.start(listener.run)
        return Node(hub, reg.node_id, publisher)

    yield start


def close_of(conn: Connection) -> Close | None:
    return conn.close


async def closed(conn: Connection) -> None:
    with trio.fail_after(10):
        while conn.close is None:
            await trio.sleep(0.01)


async def test_a_device_going_live_on_a_second_node_closes_its_older_connection_with_4017(
    db: Database, nodes: NodeFactory
) -> None:
    a, b = await nodes(), await nodes()
    older = connect(a.hub, "alex", "alex-desktop", "macos")
    laptop = connect(a.hub, "alex", "alex-laptop", "windows")
    await a.publisher.wait_published()

    newer = connect(b.hub, "alex", "alex-desktop", "macos")
    await b.publisher.wait_published()
    await closed(older)

    assert older.close == REPLACED
    assert newer.phase is Phase.LIVE and newer.close is None
    assert laptop.phase is Phase.LIVE and laptop.close is None  # another device: untouched
    a.hub.ended(older)
    await a.publisher.wait_published()
    rows = await presence_rows(db)
    assert [(r[1], r[2]) for r in rows] == sorted(
        [("alex-desktop", b.node_id), ("alex-laptop", a.node_id)]
    )


async def test_another_persons_device_with_the_same_id_is_never_replaced(
    nodes: NodeFactory,
) -> None:
    a, b = await nodes(), await nodes()
    alex = connect(a.hub, "alex", "desk", "macos")
    await a.publisher.wait_published()
    sam = connect(b.hub, "sam", "desk", "macos")
    phone_on_b = connect(b.hub, "alex", "alex-phone", "ios")
    await b.publisher.wait_published()

    # Wait for a replacement that does happen (alex's phone, newer on A), by when a
    # wrong one would have arrived too; alex's and sam's "desk" both stay.
    phone_on_a = connect(a.hub, "alex", "alex-phone", "ios")
    await a.publisher.wait_published()
    await closed(phone_on_b)
    assert alex.close is None and sam.close is None and phone_on_a.close is None


async def test_the_older_connection_is_the_one_the_cluster_learnt_of_first(
    db: Database, clock: FakeClock
) -> None:
    a, b = registry(db, clock, "api"), registry(db, clock, "api")
    await a.beat()
    await b.beat()
    desktop = PresenceEntry("alex-desktop", "macos", frozenset(), False)

    async def write(node: str, serial: int) -> None:
        await db.run(
            lambda c: cluster.publish_presence(
                c,
                node_id=node,
                people=["alex"],
                entries=[("alex", desktop, serial)],
                now=clock.now(),
            )
        )

    notifications = await listening(db)
    await write(a.node_id, 1)
    await write(b.node_id, 7)  # learnt of after a's serial 1: a's is replaced
    await write(a.node_id, 1)  # only a focus change of a's: it stays the older one
    await write(a.node_id, 2)  # a's newer connection: now b's serial 7 is the older
    got = await notifications.wait(3)
    assert [replaced_connection(p) for p in got] == [
        (a.node_id, "alex", "alex-desktop", 1),
        (a.node_id, "alex", "alex-desktop", 1),
        (b.node_id, "alex", "alex-desktop", 7),
    ]


async def test_a_listener_that_was_away_closes_what_was_replaced_meanwhile(
    db: Database, nodes: NodeFactory, clock: FakeClock
) -> None:
    hub = Hub(metrics=Metrics(), outbound_queue_max=4)
    reg = registry(db, clock, "api")
    await reg.beat()
    publisher = SharedPresencePublisher(
        hub=hub, db=db, node_id=reg.node_id, clock=clock, metrics=Metrics(), wait_limit=10
    )
    older = connect(hub, "alex", "alex-desktop", "macos")
    async with trio.open_nursery() as nursery:
        await nursery.start(publisher.run)
        await publisher.wait_published()
        b = await nodes()
        connect(b.hub, "alex", "alex-desktop", "macos")
        await b.publisher.wait_published()
        assert close_of(older) is None  # nobody listened on this node

        assert await db.run(lambda c: cluster.replaced_here(c, node_id=reg.node_id)) == [
            ("alex", "alex-desktop", older.serial)
        ]
        listener = RevocationListener(
            database_url=db.url,
            hub=hub,
            retry_interval=timedelta(milliseconds=50),
            node_id=reg.node_id,
        )
        await nursery.start(listener.run)
        await closed(older)
        assert close_of(older) == REPLACED
        nursery.cancel_scope.cancel()


def test_a_replacement_notification_is_read_strictly() -> None:
    good = {"node_id": "n", "user_id": "u", "device_id": "d", "serial": 3}
    assert replaced_connection(json.dumps(good)) == ("n", "u", "d", 3)
    for bad in (
        "",
        "[]",
        "{",
        json.dumps({**good, "serial": "3"}),
        json.dumps({**good, "serial": True}),
    ):
        assert replaced_connection(bad) is None
    assert (
        replaced_connection(json.dumps({k: v for k, v in good.items() if k != "node_id"})) is None
    )


class Notifications:
    """Replacement notifications seen by a dedicated ``LISTEN`` connection."""

    def __init__(self, url: str) -> None:
        self._conn = connect_dedicated(url)
        self._conn.execute(f"LISTEN {cluster.REPLACED_CHANNEL}")

    async def wait(self, count: int) -> list[str]:
        got: list[str] = []

        def drain() -> None:
            for n in self._conn.notifies(timeout=0.2, stop_after=count - len(got)):
                got.append(n.payload)

        with trio.fail_after(10):
            while len(got) < count:
                await trio.to_thread.run_sync(drain)
        self._conn.close()
        return got


async def listening(db: Database) -> Notifications:
    return await trio.to_thread.run_sync(Notifications, db.url)
