"""The node registry (``cluster.mode = "multi"``): heartbeats, gone nodes, sweeping,
leaving; and jobs targeted at a node that is gone."""

from __future__ import annotations

from datetime import timedelta

import trio

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.store import cluster
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import JobSpec
from tests.cluster.support import TIMEOUT, presence_rows, registry, sql


def server_heartbeat() -> timedelta:
    """A node's heartbeat interval (``server.heartbeat``'s default)."""
    return timedelta(seconds=2)


DESKTOP = PresenceEntry("alex-desktop", "macos", frozenset({"t1"}), False)


def gauge(metrics: Metrics, role: str) -> float:
    return metrics.registry.get_sample_value("bothy_cluster_nodes", {"role": role}) or 0.0


async def publish(db: Database, clock: FakeClock, node_id: str, *entries: PresenceEntry) -> bool:
    return await db.run(
        lambda c: cluster.publish_presence(
            c,
            node_id=node_id,
            people=["alex"],
            entries=[("alex", e, i) for i, e in enumerate(entries, 1)],
            now=clock.now(),
        )
    )


async def test_the_first_heartbeat_registers_the_node_and_the_gauge_counts_it(
    db: Database, clock: FakeClock
) -> None:
    metrics = Metrics()
    worker = registry(db, clock, "worker", metrics)
    api = registry(db, clock, "api")
    await api.beat()

    await worker.beat()

    assert {n.node_id for n in worker.nodes} == {worker.node_id, api.node_id}
    assert (gauge(metrics, "worker"), gauge(metrics, "api"), gauge(metrics, "all")) == (1, 1, 0)
    assert worker.healthy()
    status = worker.status()
    assert status["node_id"] == worker.node_id
    assert sorted(status["nodes"], key=lambda n: n["role"]) == [
        {"node_id": api.node_id, "role": "api"},
        {"node_id": worker.node_id, "role": "worker"},
    ]


async def test_a_node_without_a_heartbeat_for_node_timeout_is_gone_and_swept(
    db: Database, clock: FakeClock
) -> None:
    quiet, alive = registry(db, clock, "api"), registry(db, clock, "worker")
    await quiet.beat()
    assert await publish(db, clock, quiet.node_id, DESKTOP)

    clock.advance(TIMEOUT + timedelta(milliseconds=1))
    swept = await alive.beat()

    assert swept.nodes == 1 and swept.presence == 1
    assert [n.node_id for n in alive.nodes] == [alive.node_id]
    assert await presence_rows(db) == []


async def test_a_node_is_live_until_its_heartbeat_is_exactly_node_timeout_old(
    db: Database, clock: FakeClock
) -> None:
    quiet, alive = registry(db, clock, "api"), registry(db, clock, "worker")
    await quiet.beat()

    clock.advance(TIMEOUT)
    swept = await alive.beat()

    assert swept.nodes == 0
    assert {n.node_id for n in alive.nodes} == {quiet.node_id, alive.node_id}


async def test_a_node_taken_for_gone_joins_again_and_asks_for_its_presence_again(
    db: Database, clock: FakeClock
) -> None:
    late, alive = registry(db, clock, "api"), registry(db, clock, "worker")
    asked: list[bool] = []
    late.on_rejoin = lambda: asked.append(True)
    await late.beat()
    clock.advance(TIMEOUT * 2)
    await alive.beat()  # sweeps the late node
    assert asked == []

    await late.beat()

    assert asked == [True]
    assert late.node_id in {n.node_id for n in late.nodes}


async def test_after_the_database_was_away_nobody_is_swept_until_all_had_node_timeout_to_beat(
    db: Database, clock: FakeClock
) -> None:
    """A failover: no node could beat for longer than ``node_timeout``. The first to
    beat again must not take the others for gone (and end their running jobs
    ``node_gone`` under them); one that stays silent a ``node_timeout`` longer is."""
    late, dead, alive = (registry(db, clock, role) for role in ("api", "worker", "all"))
    rejoined: list[bool] = []
    late.on_rejoin = lambda: rejoined.append(True)
    for node in (late, dead, alive):
        await node.beat()
    running = JobSpec("notify.gateway_send", {}, clock.now(), 3, "hint", late.node_id)
    await db.run(lambda c: queue.insert(c, [running], clock.now()))
    await sql(db, "UPDATE bothy.jobs SET state = 'running'")  # claimed by the late node

    clock.advance(TIMEOUT * 2)  # the database was away
    swept = await alive.beat()
    await late.beat()

    assert swept == cluster.SweepResult(0, 0, {})
    assert rejoined == []  # its row was kept: nothing to publish again
    assert await sql(db, "SELECT state FROM bothy.jobs") == [("running",)]

    clock.advance(TIMEOUT / 2)
    await late.beat()
    assert (await alive.beat()).nodes == 0  # still the grace
    clock.advance(TIMEOUT / 2 + timedelta(milliseconds=1))
    swept = await alive.beat()

    assert swept.nodes == 1
    assert {n.node_id for n in alive.nodes} == {late.node_id, alive.node_id}
    assert await sql(db, "SELECT state FROM bothy.jobs") == [("running",)]


async def test_after_the_registry_was_emptied_nobody_is_swept_until_all_had_node_timeout_to_beat(
    db: Database, clock: FakeClock
) -> None:
    """A promoted replica (or a server restarted after a crash) starts the unlogged
    ``bothy.nodes`` empty: the first node to beat there finds every other row gone,
    its own too, and must not end the others' running jobs ``node_gone``."""
    late, alive = registry(db, clock, "api"), registry(db, clock, "all")
    await late.beat()
    await alive.beat()
    running = JobSpec("notify.gateway_send", {}, clock.now(), 3, "hint", late.node_id)
    await db.run(lambda c: queue.insert(c, [running], clock.now()))
    await sql(db, "UPDATE bothy.jobs SET state = 'running'")  # claimed by the late node
    await sql(db, "TRUNCATE bothy.nodes")  # the failover

    clock.advance(server_heartbeat())
    swept = await alive.beat()
    clock.advance(TIMEOUT / 2)
    swept_later = await alive.beat()  # still within node_timeout of finding it empty
    await late.beat()

    assert swept == swept_later == cluster.SweepResult(0, 0, {})
    assert await sql(db, "SELECT state FROM bothy.jobs") == [("running",)]
    assert {n.node_id for n in alive.nodes} == {alive.node_id}
    assert {n.node_id for n in late.nodes} == {late.node_id, alive.node_id}


async def test_presence_of_a_node_missing_from_the_registry_is_not_written(
    db: Database, clock: FakeClock
) -> None:
    ghost = registry(db, clock, "api")

    assert not await publish(db, clock, ghost.node_id, DESKTOP)
    assert await presence_rows(db) == []


async def test_jobs_for_a_gone_node_end_as_node_gone_and_no_other_job_changes(
    db: Database, clock: FakeClock
) -> None:
    metrics = Metrics()
    gone, alive = registry(db, clock, "api"), registry(db, clock, "worker", metrics)
    await gone.beat()
    await alive.beat()
    now = clock.now()

    def spec(name: str, node: str | None, delay: float = 0) -> JobSpec:
        return JobSpec(
            "notify.gateway_send" if node else "notify.push_send",
            {"name": name},
            now + timedelta(seconds=delay),
            3,
            unique_key=name,
            node_id=node,
        )

    await db.run(
        lambda c: queue.insert(
            c,
            [
                spec("waiting", gone.node_id),
                spec("claimed", gone.node_id),
                spec("other", alive.node_id),
                spec("delayed-push", None, delay=60),
            ],
            now,
        )
    )
    await sql(db, "UPDATE bothy.jobs SET state = 'running' WHERE unique_key = 'claimed'")

    for _ in range(2):  # the alive node keeps beating; the other does not
        clock.advance(TIMEOUT)
        await alive.beat()

    rows = dict(
        (r[0], (r[1], r[2]))
        for r in await sql(db, "SELECT unique_key, state, last_error FROM bothy.jobs")
    )
    assert rows == {
        "waiting": ("completed", "node_gone"),
        "claimed": ("completed", "node_gone"),
        "other": ("available", None),
        "delayed-push": ("available", None),
    }
    assert metrics.skipped("node_gone") == 2
    assert (
        metrics.registry.get_sample_value(
            "bothy_jobs_finished_total",
            {"kind": "notify.gateway_send", "result": "skipped_node_gone"},
        )
        == 2
    )


async def test_leaving_removes_the_row_and_presence_and_ends_its_jobs_at_once(
    db: Database, clock: FakeClock
) -> None:
    leaving, staying = registry(db, clock, "api"), registry(db, clock, "worker")
    await leaving.beat()
    await staying.beat()
    assert await publish(db, clock, leaving.node_id, DESKTOP)
    await db.run(
        lambda c: queue.insert(
            c,
            [JobSpec("notify.gateway_send", {}, clock.now(), 3, "gw", leaving.node_id)],
            clock.now(),
        )
    )

    await leaving.leave()
    await staying.beat()

    assert [n.node_id for n in staying.nodes] == [staying.node_id]
    assert await presence_rows(db) == []
    assert await sql(db, "SELECT state, last_error FROM bothy.jobs") == [("completed", "node_gone")]
    assert not leaving.healthy()


async def test_a_registry_that_never_beat_is_not_healthy_and_leaves_nothing(
    db: Database, clock: FakeClock
) -> None:
    node = registry(db, clock)

    await node.leave()

    assert not node.healthy()
    assert await sql(db, "SELECT count(*) FROM bothy.nodes") == [(0,)]


async def test_two_late_nodes_beating_at_once_both_stay_in_the_registry(
    db: Database, clock: FakeClock
) -> None:
    first, second = registry(db, clock, "api"), registry(db, clock, "worker")
    await first.beat()
    await second.beat()

    for _ in range(5):
        clock.advance(TIMEOUT * 2)  # each takes the other for gone
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.beat)
            nursery.start_soon(second.beat)
    await first.beat()
    await second.beat()

    assert {n.node_id for n in second.nodes} == {first.node_id, second.node_id}


async def test_a_heartbeat_that_fails_with_a_bug_restarts_the_loop_not_the_node(
    db: Database, clock: FakeClock
) -> None:
    metrics = Metrics()
    node = registry(db, clock, "api", metrics)
    failures: list[bool] = []

    def broken_once() -> None:
        if not failures:
            failures.append(True)
            raise RuntimeError("a bug in the rejoin callback")

    node.on_rejoin = broken_once
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            # Taken for gone: the next heartbeat joins again, and its callback raises.
            await sql(db, "DELETE FROM bothy.nodes WHERE node_id = %s", (node.node_id,))
            while not failures:
                await trio.sleep(0.05)
            while (
                metrics.registry.get_sample_value(
                    "bothy_service_restarts_total", {"service": "registry"}
                )
                != 1
            ):
                await trio.sleep(0.05)
            beats = node.nodes
            while node.nodes is beats:  # a heartbeat after the restart
                await trio.sleep(0.05)
            assert node.healthy()
            rows = await sql(
                db, "SELECT count(*) FROM bothy.nodes WHERE node_id = %s", (node.node_id,)
            )
            assert rows == [(1,)]
            nursery.cancel_scope.cancel()
    rows = await sql(db, "SELECT count(*) FROM bothy.nodes WHERE node_id = %s", (node.node_id,))
    assert rows == [(0,)]  # it still left the registry at the end
