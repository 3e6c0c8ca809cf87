"""A cluster in one process: the role table, gateway hints routed to the node that
holds the person's connections, and what a publish that reached nobody records.

Nodes are real daemons (real gateway on 127.0.0.1:0, one test database) sharing a
fake clock, so they agree on who is live; the real-process scenarios are in
``test_processes.py``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import trio

from bothy_notify.cli import main
from bothy_notify.config import ClusterMode, Role
from bothy_notify.kernel.clock import FakeClock, to_unix_micros
from bothy_notify.notify.jobs.args import GatewaySendArgs
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Database, StoreUnavailable
from bothy_notify.store.jobs import JobSpec
from bothy_notify.wiring import Daemon, RoleSpec, role_spec
from gateway.service import build_gateway
from tests.cluster.support import cluster_config, sql
from tests.gateway.client import connect_live
from tests.gateway.world import DELAY, GATEWAY_SEND, PUSH_SEND, jobs_for, message, pushes, world
from tests.harness import Launch, Node, device_token

ROLES = [
    # role, mode: http, gateway, round+jobs, presence, live routes, publisher,
    #             gateway jobs only, registry, shares presence
    ("all", "single", RoleSpec("full", True, True, "hub", "jobs", "hub")),
    ("worker", "single", RoleSpec("operator", False, True, "nobody", "fail_closed", None)),
    ("api", "single", RoleSpec("full", True, False, None, None, None)),
    ("all", "multi", RoleSpec("full", True, True, "shared", "jobs", "hub", False, True, True)),
    ("worker", "multi", RoleSpec("operator", False, True, "shared", "jobs", None, False, True)),
    ("api", "multi", RoleSpec("full", True, False, None, None, "hub", True, True, True)),
]


@pytest.mark.parametrize(("role", "mode", "spec"), ROLES)
def test_the_role_table_derives_each_nodes_wiring(role: str, mode: str, spec: RoleSpec) -> None:
    assert role_spec(Role(role), ClusterMode(mode)) == spec


async def cluster(launch: Launch, clock: FakeClock, *roles: str, **sections: object) -> list[Node]:
    """Nodes of one cluster, in order, each a real daemon; gateway nodes get the real gateway."""
    nodes = []
    for role in roles:
        nodes.append(
            await launch(
                gateway_factory=build_gateway,
                config=cluster_config(role, **sections),
                clock=clock,
            )
        )
    return nodes


async def test_a_worker_of_a_cluster_keeps_the_desktop_rules_for_a_desktop_on_another_node(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    api, worker = await cluster(launch, clock, "api", "worker")
    await world(api)
    desktop = await connect_live(nursery, api, "alex", "alex-desktop", "macos")

    await desktop.focus(["t1"])
    await api.append(message(1))
    await worker.settle()
    assert await jobs_for(worker, PUSH_SEND) == []
    assert await jobs_for(worker, GATEWAY_SEND) == []
    assert worker.skipped("active_in_thread") == 1

    await desktop.focus(["t2"])
    await api.append(message(2))
    await worker.settle()
    (hint,) = await jobs_for(worker, GATEWAY_SEND)
    (push,) = await jobs_for(worker, PUSH_SEND)
    assert push["scheduled_at"] == clock.now() + timedelta(seconds=DELAY)
    frame = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert frame["payload"]["nid"] == hint["args"]["nid"] == push["args"]["nid"]
    targets = await sql(api.db, "SELECT node_id::text FROM bothy.jobs WHERE id = %s", (hint["id"],))
    assert targets == [(api.daemon.node_id,)]


async def test_a_hint_goes_to_every_node_holding_a_connection_of_the_person_once(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    a, b, worker = await cluster(launch, clock, "api", "api", "worker")
    await world(a)
    desktop = await connect_live(nursery, a, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, b, "alex", "alex-laptop", "windows")
    await desktop.focus([])
    await laptop.focus([])

    await a.append(message(1))
    await worker.settle()

    targets = await sql(
        worker.db,
        "SELECT node_id::text FROM bothy.jobs WHERE kind = %s ORDER BY node_id",
        (GATEWAY_SEND,),
    )
    assert sorted(targets) == sorted([(a.daemon.node_id,), (b.daemon.node_id,)])
    await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    await laptop.wait_for(lambda f: f.get("type") == "notification.created")
    await worker.settle()
    assert len(desktop.notifications()) == len(laptop.notifications()) == 1
    for node in (a, b):
        published = node.metrics.registry.get_sample_value(
            "bothy_jobs_finished_total", {"kind": GATEWAY_SEND, "result": "published"}
        )
        assert published == 1


async def test_a_phone_push_waits_for_a_desktop_on_another_node_and_is_dropped_after_a_read(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    a, b, worker = await cluster(launch, clock, "api", "api", "worker")
    await world(a)
    desktop = await connect_live(nursery, a, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    await a.append(message(1))
    await worker.settle()

    response = await b.request(
        "PUT",
        "/v1/threads/t1/read",
        json={"seq": 1},
        token=device_token("alex", "alex-desktop", "macos"),
    )
    assert response.status_code == 200
    await worker.advance(DELAY)

    assert pushes(worker) == []
    assert worker.skipped("read") == 1


async def test_a_publish_that_reaches_no_connection_is_recorded_as_such(
    launch: Launch, clock: FakeClock
) -> None:
    node = await launch(gateway_factory=build_gateway, clock=clock)
    await world(node)
    now = clock.now()
    args = GatewaySendArgs(
        nid="n1",
        user_id="alex",
        kind="message",
        count=1,
        quiet=False,
        due_at=to_unix_micros(now),
        appended_at=to_unix_micros(now),
        thread_id="t1",
        message_id="m1",
    )
    await node.db.run(
        lambda c: queue.insert(c, [JobSpec(GATEWAY_SEND, args.to_args(), now, 3)], now)
    )
    node.daemon.runner.nudge()  # type: ignore[union-attr]

    await node.settle()

    assert node.skipped("no_connection") == 1
    assert (
        node.metrics.registry.get_sample_value(
            "bothy_jobs_finished_total", {"kind": GATEWAY_SEND, "result": "skipped_no_connection"}
        )
        == 1
    )
    assert (
        node.metrics.registry.get_sample_value(
            "bothy_jobs_finished_total", {"kind": GATEWAY_SEND, "result": "published"}
        )
        is None
    )


async def test_a_node_claims_jobs_for_itself_and_for_any_node_only(
    db: Database, clock: FakeClock
) -> None:
    mine, other = "01890000-0000-7000-8000-000000000001", "01890000-0000-7000-8000-000000000002"
    now = clock.now()
    specs = [
        JobSpec(GATEWAY_SEND, {"n": 1}, now, 3, "mine", mine),
        JobSpec(GATEWAY_SEND, {"n": 2}, now, 3, "other", other),
        JobSpec(GATEWAY_SEND, {"n": 3}, now, 3, "anyone"),
        JobSpec(GATEWAY_SEND, {"n": 4}, now + timedelta(seconds=30), 3, "later", mine),
    ]
    await db.run(lambda c: queue.insert(c, specs, now))

    claimed, due = await db.run(
        lambda c: queue.claim_and_peek(
            c, now=now, limit=10, lease=timedelta(seconds=30), kinds=[GATEWAY_SEND], node_id=mine
        )
    )

    assert sorted(int(j.args["n"]) for j in claimed) == [1, 3]
    assert due == now + timedelta(seconds=30)  # the other node's due job is not this node's


async def test_a_single_node_registers_nothing_and_targets_no_job(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    node = await launch(gateway_factory=build_gateway, clock=clock)
    await world(node)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus([])

    await node.append(message(1))
    await node.settle()

    await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert await node.sql("SELECT count(*) FROM bothy.nodes") == [(0,)]
    assert await node.sql("SELECT count(*) FROM bothy.presence") == [(0,)]
    assert await node.sql("SELECT node_id FROM bothy.jobs WHERE kind = %s", (GATEWAY_SEND,)) == [
        (None,)
    ]
    assert node.daemon.registry is None


async def test_readyz_of_a_cluster_node_shows_the_live_nodes_it_sees(
    launch: Launch, clock: FakeClock
) -> None:
    api, worker = await cluster(launch, clock, "api", "worker")

    response = await worker.request("GET", "/readyz")

    assert response.status_code == 200
    body = response.json()
    assert body["checks"]["cluster"] is True
    assert body["cluster"]["node_id"] == worker.daemon.node_id
    assert sorted((n["role"], n["node_id"]) for n in body["cluster"]["nodes"]) == [
        ("api", api.daemon.node_id),
        ("worker", worker.daemon.node_id),
    ]
    single = await launch(clock=clock, config=cluster_config("worker", cluster={"mode": "single"}))
    assert "cluster" not in (await single.request("GET", "/readyz")).json()


async def test_a_cluster_node_refuses_to_start_without_its_database() -> None:
    daemon = Daemon(cluster_config("worker"), database_url="postgresql://127.0.0.1:1/none")

    with pytest.raises(StoreUnavailable, match=r'cluster.mode = "multi": the database'):
        await daemon.run()


def test_the_cli_says_why_a_cluster_node_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        '[cluster]\nmode = "multi"\n[database]\nurl = "postgresql://127.0.0.1:1/none"\n'
        '[log]\nlevel = "error"\n'
    )

    code = main(["run", "--config", str(config)])

    assert code == 1
    err = capsys.readouterr().err
    assert 'cluster.mode = "multi": the database (database.url) cannot be reached' in err
    assert "127.0.0.1:1" not in err
