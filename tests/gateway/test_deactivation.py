"""A person the app deactivates loses their live connections (4010 ``person
deactivated``) and cannot identify again; other people are not touched."""

from __future__ import annotations

import trio

from tests.gateway.client import GatewayClient, connect_live, gateway_address, identify
from tests.gateway.world import start
from tests.harness import Launch, Node, device_token, ev

DEACTIVATED = (4010, "person deactivated")


async def deactivate(node: Node, user: str) -> None:
    await node.append(ev("user.upserted", user_id=user, kind="human", active=False))
    await node.settle()


async def test_deactivating_a_person_closes_all_their_connections_with_4010(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop")
    bot = await connect_live(nursery, node, "alex", "alex-bot", "linux", kind="agent")
    sam = await connect_live(nursery, node, "sam", "sam-desktop")

    await deactivate(node, "alex")

    assert await desktop.wait_closed() == DEACTIVATED
    assert await bot.wait_closed() == DEACTIVATED
    await sam.send("ping")
    await sam.wait_op("pong")


async def test_a_deactivated_person_is_refused_at_identify_and_nothing_is_written(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await deactivate(node, "alex")
    client = await GatewayClient.connect(nursery, gateway_address(node))

    await identify(client, device_token("alex", "alex-new-laptop", "linux"))

    assert await client.wait_closed() == DEACTIVATED
    assert [f["op"] for f in client.frames] == ["hello"]
    assert await node.sql(
        "SELECT count(*) FROM bothy.devices WHERE device_id = 'alex-new-laptop'"
    ) == [(0,)]


async def test_a_deactivation_missed_while_not_listening_is_found_on_reconnecting(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop")
    sam = await connect_live(nursery, node, "sam", "sam-desktop")

    # Deactivated behind the listener's back (no NOTIFY), then its connection is lost.
    await node.sql("UPDATE bothy.users SET active = false WHERE user_id = 'alex'")
    await node.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query = 'LISTEN bothy_user_deactivated'"
    )

    assert await desktop.wait_closed() == DEACTIVATED
    await sam.send("ping")
    await sam.wait_op("pong")


async def test_activating_a_person_again_lets_them_connect(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await deactivate(node, "alex")
    await node.append(ev("user.upserted", user_id="alex", kind="human", active=True))
    await node.settle()

    client = await connect_live(nursery, node, "alex", "alex-desktop")

    await client.send("ping")
    await client.wait_op("pong")
