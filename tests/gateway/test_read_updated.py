"""``read.updated`` (issue 20): a read position moved forward reaches the person's
other live connections, never the connection whose ``read`` caused it; and the
gateway's ``read`` op sends the clear-on-read push like every other way in.

Real daemon (role ``all``), real gateway on 127.0.0.1:0, real PostgreSQL, the
fake clock and the fake provider.
"""

from __future__ import annotations

from typing import Any

import trio

from tests.gateway.client import GatewayClient, connect_live
from tests.gateway.world import message, pushes, start
from tests.harness import Launch, device_token, ev

Frame = dict[str, Any]


def read_updates(client: GatewayClient) -> list[Frame]:
    return [f for f in client.frames if f.get("type") == "read.updated"]


async def updated(client: GatewayClient) -> Frame:
    return await client.wait_for(lambda f: f.get("type") == "read.updated")


async def test_a_read_op_reaches_the_other_connection_with_the_stored_position_and_badge(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await node.append(message(1), message(2))
    await node.settle()
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    await desktop.read("t1", 2)
    frame = await updated(laptop)

    assert set(frame) == {"type", "id", "occurred_at", "audience", "resource", "payload"}
    assert frame["audience"] == "alex"
    assert frame["resource"] == {"kind": "thread", "id": "t1"}
    assert frame["payload"] == {"thread_id": "t1", "seq": 2, "badge": 0}
    assert frame["id"] and frame["occurred_at"].endswith("Z")


async def test_the_connection_that_read_gets_no_read_updated(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    await desktop.read("t1", 1)
    await updated(laptop)
    await desktop.read("t2", 0)  # a later round trip: the first frame would be in by now

    assert read_updates(desktop) == []


async def test_another_persons_connection_gets_no_read_updated(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")
    sam = await connect_live(nursery, node, "sam", "sam-desktop", "macos")

    await desktop.read("t1", 1)
    await updated(laptop)
    await sam.read("t1", 0)

    assert read_updates(sam) == []


async def test_a_put_read_reaches_the_live_connections_of_other_devices(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")

    answer = await node.request(
        "PUT", "/v1/threads/t1/read", token=device_token("alex", "alex-phone"), json={"seq": 3}
    )
    assert answer.status_code == 200, answer.text

    assert (await updated(desktop))["payload"]["seq"] == 3


async def test_the_thread_read_event_reaches_every_live_connection(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    await node.append(ev("thread.read", user_id="alex", thread_id="t1", seq=4))
    await node.settle()

    assert (await updated(desktop))["payload"]["seq"] == 4
    assert (await updated(laptop))["payload"]["seq"] == 4


async def test_a_read_op_on_the_desktop_sends_the_phone_one_read_push(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await node.append(message(1))
    await node.settle()
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")

    await desktop.read("t1", 1)
    await node.advance(2)

    assert [p for p in pushes(node) if p["kind"] == "read"] == [
        {"kind": "read", "thread_id": "t1", "seq": 1, "badge": 0, "urgency": "low"}
    ]
