"""Shared presence: a gateway node publishes its connections' presence facts in
batches, and a decision reads the union of the live nodes' facts in its group read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest
import trio

from bothy_notify.auth import DeviceClaims
from bothy_notify.cluster import NodeRegistry
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.kernel.supervise import Supervised
from bothy_notify.notify import facts
from bothy_notify.notify.facts import SharedPresence
from bothy_notify.store import cluster
from bothy_notify.store.db import Database
from gateway.closes import REPLACED
from gateway.hub import Hub
from gateway.shared_presence import SharedPresencePublisher
from tests.cluster.support import TIMEOUT, connect, presence_rows, registry, sql

Node = tuple[Hub, NodeRegistry, SharedPresencePublisher, Metrics]
"""A hub, its node's registry row, the running publisher, the node's metrics."""


@pytest.fixture
async def node(db: Database, clock: FakeClock, nursery: trio.Nursery) -> AsyncIterator[Node]:
    metrics = Metrics()
    hub = Hub(metrics=metrics, outbound_queue_max=4)
    reg = registry(db, clock, "api")
    await reg.beat()
    publisher = SharedPresencePublisher(
        hub=hub, db=db, node_id=reg.node_id, clock=clock, metrics=metrics, wait_limit=10
    )
    await nursery.start(publisher.run)
    yield hub, reg, publisher, metrics


def writes(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("bothy_cluster_presence_writes_total") or 0.0


async def test_a_live_connections_facts_are_in_the_table_once_published(
    db: Database, node: Node
) -> None:
    hub, reg, publisher, _ = node
    desktop = connect(hub, "alex", "alex-desktop", "macos")
    hub.set_focus(desktop, frozenset({"t1", "t2"}), False)

    await publisher.wait_published()

    assert await presence_rows(db) == [
        ("alex", "alex-desktop", reg.node_id, "macos", ["t1", "t2"], False)
    ]


async def test_only_counted_connections_are_published(db: Database, node: Node) -> None:
    hub, _, publisher, _ = node
    connect(hub, "alex", "alex-bot", "linux", kind="agent")
    catching_up = hub.open()
    hub.identify(catching_up, DeviceClaims("alex", "alex-laptop", "windows", "user"))

    await publisher.wait_published()

    assert await presence_rows(db) == []


async def test_a_burst_of_focus_changes_is_written_in_a_few_batches(
    db: Database, node: Node
) -> None:
    hub, _, publisher, metrics = node
    await publisher.wait_published()
    before = writes(metrics)
    desktops = [connect(hub, f"u{i}", f"u{i}-desktop") for i in range(50)]
    for round_ in range(4):
        for conn in desktops:
            hub.set_focus(conn, frozenset({f"t{round_}"}), round_ % 2 == 1)

    await publisher.wait_published()

    assert writes(metrics) - before <= 2
    rows = await presence_rows(db)
    assert len(rows) == 50
    assert {(r[4][0], r[5]) for r in rows} == {("t3", True)}


async def test_a_closed_connection_leaves_the_table(db: Database, node: Node) -> None:
    hub, _, publisher, _ = node
    desktop = connect(hub, "alex", "alex-desktop")
    connect(hub, "alex", "alex-phone", "ios")
    await publisher.wait_published()

    hub.close(desktop, REPLACED)
    hub.ended(desktop)
    await publisher.wait_published()

    assert [r[1] for r in await presence_rows(db)] == ["alex-phone"]


async def test_presence_lost_with_the_registry_row_is_published_again_after_rejoining(
    db: Database, clock: FakeClock, node: Node
) -> None:
    hub, reg, publisher, _ = node
    reg.on_rejoin = publisher.publish_all
    connect(hub, "alex", "alex-desktop")
    await publisher.wait_published()
    clock.advance(TIMEOUT * 2)
    await registry(db, clock, "worker").beat()  # another node sweeps this one
    assert await presence_rows(db) == []

    await reg.beat()  # joins again
    await publisher.wait_published()

    assert [r[1] for r in await presence_rows(db)] == ["alex-desktop"]


async def test_a_gone_nodes_rows_are_never_written_again_by_a_late_batch(
    db: Database, clock: FakeClock, node: Node
) -> None:
    hub, _, publisher, _ = node
    await publisher.wait_published()
    clock.advance(TIMEOUT * 2)
    await registry(db, clock, "worker").beat()  # this node is swept
    tried = publisher.statistics()["batches"]

    connect(hub, "alex", "alex-desktop")
    with trio.fail_after(10):
        while publisher.statistics()["batches"] == tried:
            await trio.sleep(0.01)

    assert await presence_rows(db) == []
    assert publisher.statistics()["written"] < publisher.statistics()["changes"]


# -- the union read --------------------------------------------------------------------


async def write(
    db: Database, clock: FakeClock, node_id: str, user: str, *entries: PresenceEntry
) -> None:
    assert await db.run(
        lambda c: cluster.publish_presence(
            c,
            node_id=node_id,
            people=[user],
            entries=[(user, e, i) for i, e in enumerate(entries, 1)],
            now=clock.now(),
        )
    )


async def read(db: Database, clock: FakeClock, *users: str) -> facts.GroupFacts:
    shared = SharedPresence(TIMEOUT)
    return await db.run(
        lambda c: facts.load_group(
            c,
            users=users,
            pairs=(),
            follows=None,
            with_windows=False,
            presence_since=shared.since(clock.now()),
        )
    )


DESKTOP = PresenceEntry("alex-desktop", "macos", frozenset({"t1"}), False)
LAPTOP = PresenceEntry("alex-laptop", "windows", frozenset(), True)


async def test_the_group_read_holds_the_union_of_the_live_nodes_presence(
    db: Database, clock: FakeClock
) -> None:
    a, b = registry(db, clock, "api"), registry(db, clock, "api")
    await a.beat()
    await b.beat()
    await write(db, clock, a.node_id, "alex", DESKTOP)
    await write(db, clock, b.node_id, "alex", LAPTOP)

    group = await read(db, clock, "alex", "sam")

    assert sorted(group.presence["alex"], key=lambda e: e.device_id) == [DESKTOP, LAPTOP]
    assert "sam" not in group.presence
    assert group.holders == {"alex": {"alex-desktop": a.node_id, "alex-laptop": b.node_id}}


async def test_a_gone_nodes_presence_is_ignored_at_once_before_any_sweep(
    db: Database, clock: FakeClock
) -> None:
    a, b = registry(db, clock, "api"), registry(db, clock, "api")
    await a.beat()
    await b.beat()
    await write(db, clock, a.node_id, "alex", DESKTOP)
    await write(db, clock, b.node_id, "alex", LAPTOP)
    clock.advance(TIMEOUT + timedelta(milliseconds=1))
    now = clock.now()
    await db.run(  # only b beats again; nobody swept a yet
        lambda c: cluster.heartbeat(
            c, node_id=b.node_id, role="api", host="h", pid=1, started_at=now, now=now
        )
    )

    group = await read(db, clock, "alex")

    assert group.presence == {"alex": (LAPTOP,)}
    assert len(await presence_rows(db)) == 2


async def test_a_device_live_on_two_nodes_counts_once_and_the_newer_row_wins(
    db: Database, clock: FakeClock
) -> None:
    old, new = registry(db, clock, "api"), registry(db, clock, "api")
    await old.beat()
    await new.beat()
    await write(db, clock, old.node_id, "alex", DESKTOP)
    clock.advance(0.5)
    moved = PresenceEntry("alex-desktop", "macos", frozenset({"t2"}), False)
    await write(db, clock, new.node_id, "alex", moved)

    group = await read(db, clock, "alex")

    assert group.presence == {"alex": (moved,)}
    assert group.holders == {"alex": {"alex-desktop": new.node_id}}


async def test_without_shared_presence_the_group_read_reads_no_presence(
    db: Database, clock: FakeClock
) -> None:
    a = registry(db, clock, "api")
    await a.beat()
    await write(db, clock, a.node_id, "alex", DESKTOP)

    group = await db.run(
        lambda c: facts.load_group(c, users=["alex"], pairs=(), follows=None, with_windows=False)
    )

    assert group.presence == {} and group.holders == {}
    assert await sql(db, "SELECT count(*) FROM bothy.presence") == [(1,)]


class ArmedClock:
    """The node's clock, except that once armed its next reading fails: a stand-in
    for any bug in a batch (the publisher reads the clock while it writes)."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.armed = False

    def now(self) -> datetime:
        if self.armed:
            self.armed = False
            raise RuntimeError("a batch broke")
        return self._clock.now()

    async def sleep_until(self, when: datetime) -> None:
        await self._clock.sleep_until(when)


async def test_a_batch_that_fails_with_a_bug_is_written_by_the_restarted_publisher(
    db: Database, clock: FakeClock, nursery: trio.Nursery
) -> None:
    metrics = Metrics()
    hub = Hub(metrics=metrics, outbound_queue_max=4)
    reg = registry(db, clock, "api")
    await reg.beat()
    armed = ArmedClock(clock)
    publisher = SharedPresencePublisher(
        hub=hub, db=db, node_id=reg.node_id, clock=armed, metrics=metrics, wait_limit=10
    )
    supervised = Supervised("presence", publisher.run, metrics=metrics)
    await nursery.start(supervised.run)
    connect(hub, "alex", "alex-desktop")
    await publisher.wait_published()

    armed.armed = True
    connect(hub, "sam", "sam-desktop")  # its batch fails, and the publisher with it
    with trio.fail_after(10):
        while supervised.restarts == 0:
            await trio.sleep(0.02)
        await publisher.wait_published()

    assert sorted(r[1] for r in await presence_rows(db)) == ["alex-desktop", "sam-desktop"]
    assert supervised.up
