"""``bothy-notify run --processes 2`` (``server.processes``) as a real command: one
parent, two node processes on shared ports (SO_REUSEPORT), real sockets, PostgreSQL.

- HTTP and the gateway on one port each, served by both processes; the embedded
  PostgreSQL started and migrated once by the parent; ``bothy_consumer_holder`` 1 on
  exactly one process; SIGTERM drains both and the command exits 0.
- Desktops spread over both processes each get their hint once, from the process
  that holds them.
- SIGKILL of one node process (the round's holder) under load: it is reported and
  started again, and no push is lost.
- Node processes that keep failing at start: the command exits non-zero.

Every wait polls a condition under an absolute timeout; nothing sleeps for a delay.
"""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from bothy_notify.kernel.sockets import bind_shared, open_shared_listener
from gateway.service import build_gateway
from testkit.daemon import DaemonFailed
from tests.cluster.live import GATEWAY_SEND, Cluster, hints, live, message, node_config, until
from tests.faults.world import World, append, count_pushes, register_phone, wait_settled
from tests.gateway.client import GatewayClient, identify
from tests.harness import device_token, ev
from tests.procs import DaemonProcess, write_config

pytestmark = pytest.mark.slow

START_TIMEOUT = 90.0
"""Seconds the parent may take to report both processes running on a loaded machine."""

Start = Callable[..., Awaitable[DaemonProcess]]


@pytest.fixture
async def groups(tmp_path: Path) -> AsyncIterator[Start]:
    """Start ``bothy-notify run`` parents: ``await groups("n", url, args=(...), **sections)``;
    each is stopped with SIGTERM at the end (killed if it outlives its drain)."""
    started: list[DaemonProcess] = []

    async def start(
        name: str, database_url: str, *, args: tuple[str, ...] = (), **sections: Any
    ) -> DaemonProcess:
        config = write_config(
            tmp_path / f"{name}.toml",
            database_url,
            record_file=tmp_path / "pushes.jsonl",
            **sections,
        )
        node = DaemonProcess(config_file=config, log_file=tmp_path / f"{name}.log", args=args)
        started.append(node)
        return await node.start(timeout=START_TIMEOUT)

    try:
        yield start
    finally:
        with trio.CancelScope(shield=True):
            for node in started:
                if node.alive():
                    await node.stop(timeout=60)


def log_lines(node: DaemonProcess) -> list[dict[str, Any]]:
    """The JSON log lines of the parent and its node processes (other lines skipped)."""
    lines = []
    for line in node.log_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


async def holders(http: httpx.AsyncClient, node: DaemonProcess) -> dict[str, float]:
    """``bothy_consumer_holder`` by process (its ``pid`` label), from one scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get(f"{node.api_url}/metrics")).text
    return {
        sample.labels["pid"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bothy_consumer_holder"
    }


async def one_holder_of_two(http: httpx.AsyncClient, node: DaemonProcess) -> bool:
    values = await holders(http, node)
    return len(values) == 2 and sorted(values.values()) == [0.0, 1.0]


async def test_two_processes_serve_one_port_each_on_one_embedded_database_and_drain_on_sigterm(
    groups: Start, tmp_path: Path
) -> None:
    node = await groups(
        "n", "", args=("--processes", "2"), database={"data_dir": str(tmp_path / "pg")}
    )
    async with httpx.AsyncClient(timeout=10) as http:

        async def both_seen() -> bool:  # each sees the other after its next heartbeat
            body = (await http.get(f"{node.api_url}/readyz")).json()
            return len(body["cluster"]["nodes"]) == 2

        await until(both_seen, "both processes in the cluster")
        # Every request on a connection of its own: the kernel spreads them.
        answered: set[str] = set()
        for _ in range(24):
            response = await http.get(f"{node.api_url}/readyz", headers={"connection": "close"})
            assert response.status_code == 200, response.text
            answered.add(response.json()["cluster"]["node_id"])
        assert len(answered) == 2
        await until(lambda: one_holder_of_two(http, node), "one holder of two processes")

    async with trio.open_nursery() as nursery:
        for i in range(4):
            assert node.gateway is not None
            client = await GatewayClient.connect(nursery, node.gateway)
            await identify(client, device_token(f"p{i}", f"d{i}", "linux"))
            await client.wait_op("catchup.complete")
        nursery.cancel_scope.cancel()

    assert await node.stop() == 0
    lines = log_lines(node)
    stopped = sorted(line["process"] for line in lines if line["msg"] == "node stopped")
    assert stopped == [1, 2]
    # The parent started the embedded server and migrated; the processes did neither.
    migrations = [line for line in lines if line["msg"] == "applying migration"]
    assert migrations and all("process" not in line for line in migrations)
    started = [line for line in lines if line["msg"] == "starting the embedded PostgreSQL server"]
    assert [line.get("process") for line in started] == [None]
    assert any(line["msg"] == "embedded PostgreSQL server stopped" for line in lines)
    assert not (tmp_path / "pg" / "postmaster.pid").exists()
    # Every line of a node process says which one wrote it.
    own = [line for line in lines if line["logger"] != "bothy.processes" and "process" in line]
    assert {line["process"] for line in own} == {1, 2}


async def test_desktops_on_either_process_get_each_hint_once_from_the_process_holding_them(
    groups: Start, fault_db: str, tmp_path: Path, nursery: trio.Nursery
) -> None:
    node = await groups("n", fault_db, **node_config("all", server={"processes": 2}))
    async with httpx.AsyncClient(timeout=10) as http:
        c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
        people = [f"p{i}" for i in range(16)]
        await c.append(
            node,
            ev("user.upserted", user_id="robin", kind="human", active=True),
            ev("thread.upserted", thread_id="t1", space_id="s1"),
            *(ev("user.upserted", user_id=p, kind="human", active=True) for p in people),
            *(ev("member.added", user_id=p, scope_id="s1") for p in people),
            *(ev("thread.followed", user_id=p, thread_id="t1", level="all") for p in people),
        )
        await c.settled()
        desktops = [await live(nursery, node, p, f"{p}-desktop", "linux") for p in people]
        holding = await c.sql("SELECT DISTINCT node_id::text FROM bothy.presence")
        assert len(holding) == 2, "16 connections all landed on one process"

        await c.append(node, message(1))
        for desktop in desktops:
            await until(partial(_has, desktop, "m1"), "every desktop's hint")
        await c.settled()
        assert all(len(hints(d, "m1")) == 1 for d in desktops)
        targets = await c.sql(
            "SELECT count(DISTINCT node_id), count(*) FROM bothy.jobs WHERE kind = %s",
            (GATEWAY_SEND,),
        )
        assert targets == [(2, 16)]  # one job per desktop, on the process holding it
        published = await c.metric(
            node, "bothy_jobs_finished_total", kind=GATEWAY_SEND, result="published"
        )
        assert published == 16  # the sum of both processes, from one scrape
        assert await c.metric(node, "bothy_push_skipped_total", reason="no_connection") == 0
        assert await one_holder_of_two(http, node)


async def _has(client: GatewayClient, message_id: str) -> bool:
    return bool(hints(client, message_id))


async def test_a_killed_node_process_is_reported_started_again_and_loses_no_push(
    groups: Start, fault_db: str, tmp_path: Path
) -> None:
    node = await groups(
        "n",
        fault_db,
        **node_config("all", server={"processes": 2}, notify={"poll_interval": "50ms"}),
    )
    world = World(people=[f"person-{i}" for i in range(4)], threads=["thread-0", "thread-1"])
    await append(fault_db, world.setup_events())
    async with httpx.AsyncClient(timeout=10) as http:
        tokens = set()
        for person in world.people:
            await register_phone(http, node.api, person)
            tokens.add(f"phone-token-{person}")
        await until(lambda: one_holder_of_two(http, node), "one holder of two processes")
        holder = next(pid for pid, v in (await holders(http, node)).items() if v == 1)

        await append(fault_db, [world.message(n) for n in range(100)])
        os.kill(int(holder), signal.SIGKILL)
        await append(fault_db, [world.message(n) for n in range(100, 200)])

        async def restarted() -> bool:
            return any(
                line["msg"] == "node process exited unexpectedly; starting it again"
                for line in log_lines(node)
            ) and await one_holder_of_two(http, node)

        await until(restarted, "the killed process to be started again", 60)
        await wait_settled(fault_db)
        assert holder not in await holders(http, node)

    (report,) = [
        line
        for line in log_lines(node)
        if line["msg"] == "node process exited unexpectedly; starting it again"
    ]
    assert report["exit_status"] == "signal SIGKILL" and report["ordinal"] in (1, 2)
    assert holder not in json.dumps(report)  # no pid, no id: the ordinal says which
    expected = {(m, t) for m in world.sent for t in tokens}
    pushes = count_pushes(tmp_path / "pushes.jsonl", expected)
    print(f"killed the round holder: {pushes}")
    assert pushes.missing == 0 and pushes.unexpected == 0
    assert node.alive()
    assert await node.stop() == 0


async def test_node_processes_that_keep_failing_at_start_end_the_command_with_an_error(
    fault_db: str, tmp_path: Path
) -> None:
    not_a_directory = tmp_path / "kinds"
    not_a_directory.write_text("", encoding="utf-8")
    config = write_config(
        tmp_path / "n.toml",
        fault_db,
        server={"processes": 2},
        notify={"kinds_dir": str(not_a_directory)},
    )
    node = DaemonProcess(config_file=config, log_file=tmp_path / "n.log")
    with pytest.raises(DaemonFailed, match="exited with 2 before serving"):
        await node.start(timeout=START_TIMEOUT)
    lines = node.log_text()
    assert "node process failed at start" in lines
    assert "node processes keep failing at start; stopping" in lines


async def test_one_process_binds_as_before_and_shares_no_port(launch: Any) -> None:
    node = await launch(gateway_factory=build_gateway)
    addresses = node.addresses
    assert addresses.api is not None and addresses.gateway is not None
    for address in (addresses.api, addresses.gateway):
        with pytest.raises(OSError) as error:
            bind_shared(address).close()
        assert error.value.errno == errno.EADDRINUSE


async def test_shared_ports_take_connections_only_where_a_process_listens() -> None:
    reserved = bind_shared("127.0.0.1:0")  # the parent's: bound, not listening
    address = f"127.0.0.1:{reserved.getsockname()[1]}"
    listener = open_shared_listener(address)
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", reserved.getsockname()[1])
        accepted = await listener.accept()
        await stream.send_all(b"x")
        assert await accepted.receive_some(1) == b"x"
        await stream.aclose()
        await accepted.aclose()
    finally:
        await listener.aclose()
    with pytest.raises(OSError):  # the reservation alone answers nobody
        await trio.open_tcp_stream("127.0.0.1", reserved.getsockname()[1])
    reserved.close()
