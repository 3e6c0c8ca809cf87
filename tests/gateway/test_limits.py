"""Limits on connections: unidentified ones per node (the oldest makes room) and
identified ones per person, both closing with 4008 (``docs/protocol.md``)."""

from __future__ import annotations

from collections import deque

import trio

from gateway.limits import PendingConnections
from gateway.service import build_gateway
from tests.gateway.client import (
    GatewayClient,
    connect_live,
    gateway_address,
    gateway_of,
    gauge,
    identify,
    wait_until,
)
from tests.gateway.world import message, start
from tests.harness import Launch, Node, device_token, make_config

TOO_MANY_UNIDENTIFIED = (4008, "too many unidentified connections")
TOO_MANY_FOR_PERSON = (4008, "too many connections for this person")


def test_the_oldest_pending_connection_makes_room_for_a_new_one() -> None:
    evicted: list[str] = []
    pending = PendingConnections(2)
    first = pending.enter(lambda: evicted.append("first"))
    pending.enter(lambda: evicted.append("second"))

    pending.enter(lambda: evicted.append("third"))

    assert evicted == ["first"] and len(pending) == 2
    first.leave()  # already gone: nothing changes
    assert len(pending) == 2


def test_a_connection_that_left_no_longer_counts_and_is_never_evicted() -> None:
    evicted: list[str] = []
    pending = PendingConnections(1)
    first = pending.enter(lambda: evicted.append("first"))
    first.leave()

    pending.enter(lambda: evicted.append("second"))

    assert evicted == [] and len(pending) == 1


def test_eviction_runs_the_latest_callback() -> None:
    evicted: list[str] = []
    pending = PendingConnections(1)
    first = pending.enter(lambda: evicted.append("dropped"))
    first.on_evicted(lambda: evicted.append("closed with 4008"))

    pending.enter(lambda: None)

    assert evicted == ["closed with 4008"]


async def hello_only(nursery: trio.Nursery, node: Node) -> GatewayClient:
    client = await GatewayClient.connect(nursery, gateway_address(node))
    await client.wait_op("hello")
    return client


async def test_past_the_limit_the_oldest_unidentified_connection_closes_with_4008(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"max_unidentified_connections": 3})
    alex = await connect_live(nursery, node, "alex", "alex-desktop")
    waiting = [await hello_only(nursery, node) for _ in range(3)]

    newest = await hello_only(nursery, node)

    assert await waiting[0].wait_closed() == TOO_MANY_UNIDENTIFIED
    assert not any(c.ended for c in waiting[1:])
    await identify(newest, device_token("sam", "sam-desktop", "macos"))
    await newest.wait_op("catchup.complete")
    await alex.send("ping")
    await alex.wait_op("pong")  # identified connections never count
    assert gauge(node.metrics, "bothy_gateway_closed_total", code="4008") == 1


async def test_a_connection_still_in_the_upgrade_is_dropped_to_make_room(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"max_unidentified_connections": 2})
    host, _, port = gateway_address(node).rpartition(":")
    silent = await trio.open_tcp_stream(host, int(port))  # never sends its upgrade
    try:
        await wait_until(lambda: len(gateway_of(node)._pending) == 1)
        others = [await hello_only(nursery, node) for _ in range(2)]

        with trio.fail_after(10):
            assert await silent.receive_some(1024) == b""  # dropped without a word

        assert not any(c.ended for c in others)
        assert gauge(node.metrics, "bothy_gateway_closed_total", code="4008") == 1
    finally:
        await silent.aclose()


async def test_a_flood_of_unidentified_connections_does_not_keep_a_client_out(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"max_unidentified_connections": 20})
    alex = await connect_live(nursery, node, "alex", "alex-desktop")
    await alex.focus(["t2"])
    host, _, port = gateway_address(node).rpartition(":")
    flooded = 0

    async def flood() -> None:
        nonlocal flooded
        streams: deque[trio.SocketStream] = deque()
        try:
            while True:  # connections that never upgrade, as fast as the loop allows
                streams.append(await trio.open_tcp_stream(host, int(port)))
                flooded += 1
                if len(streams) > 100:  # long since dropped by the server
                    await streams.popleft().aclose()
        finally:
            with trio.CancelScope(shield=True):
                for stream in streams:
                    await stream.aclose()

    async with trio.open_nursery() as flooding:
        flooding.start_soon(flood)
        await wait_until(lambda: flooded > 100)  # the limit has turned over many times

        sam = await connect_live(nursery, node, "sam", "sam-desktop")
        await sam.focus(["t2"])
        await node.append(message(1))
        await node.settle()
        for client in (alex, sam):
            hint = await client.wait_for(lambda f: f.get("type") == "notification.created")
            assert hint["payload"]["message_id"] == "m1"
        flooding.cancel_scope.cancel()

    assert len(gateway_of(node)._pending) <= 20


async def test_a_person_at_the_limit_cannot_add_a_device_but_can_replace_one(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await launch(
        gateway_factory=build_gateway, config=make_config(sync={"max_connections_per_person": 2})
    )
    desktop = await connect_live(nursery, node, "alex", "alex-desktop")
    await connect_live(nursery, node, "alex", "alex-laptop", "windows")
    third = await GatewayClient.connect(nursery, gateway_address(node))

    await identify(third, device_token("alex", "alex-tablet", "ios"))

    assert await third.wait_closed() == TOO_MANY_FOR_PERSON
    assert [f["op"] for f in third.frames] == ["hello"]
    again = await connect_live(nursery, node, "alex", "alex-desktop")  # replaces its own
    assert await desktop.wait_closed() == (4017, "replaced by a newer connection")
    await again.send("ping")
    await again.wait_op("pong")
    await connect_live(nursery, node, "sam", "sam-desktop")  # another person is not limited
    assert await node.sql("SELECT device_id FROM bothy.devices ORDER BY 1") == [
        ("alex-desktop",),
        ("alex-laptop",),
        ("sam-desktop",),
    ]
