"""The gateway protocol over a real socket: phases, replies and every close code."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import RejectConnection, Request

from bothy_notify.kernel.ephemeral import EphemeralEvent
from bothy_notify.kernel.ids import new_id
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
from tests.harness import Launch, Node, device_token, ev, make_config


def personal_event(user: str, **payload: Any) -> EphemeralEvent:
    """A hint without a thread for ``user`` (admitted without a database check)."""
    return EphemeralEvent(
        type="notification.created",
        id=new_id(),
        occurred_at=datetime.now(UTC),
        audience=user,
        resource_kind="user",
        resource_id=user,
        payload={"nid": new_id(), "kind": "admin", "quiet": False, "count": 1, **payload},
    )


async def bare(launch: Launch, **sections: Any) -> Node:
    return await launch(gateway_factory=build_gateway, config=make_config(**sections))


def closed_total(node: Node, code: str) -> float:
    return gauge(node.metrics, "bothy_gateway_closed_total", code=code)


async def test_identify_gives_ready_the_unread_snapshot_and_catchup_complete_in_order(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"heartbeat": "45s"})
    await node.append(
        ev("thread.upserted", thread_id="t3", space_id="s1"),
        ev("thread.upserted", thread_id="t4", space_id="other"),
        ev("thread.followed", user_id="alex", thread_id="t3", level="none"),
        ev("thread.followed", user_id="alex", thread_id="t4", level="all"),
        message(1),
        message(2),
        message(3),
        message(1, thread="t2"),
        message(1, thread="t3"),
        message(1, thread="t4"),
        ev("thread.read", user_id="alex", thread_id="t1", seq=1),
    )
    await node.settle()

    client = await connect_live(nursery, node, "alex", "alex-desktop")

    assert client.frames == [
        {"op": "hello", "d": {"heartbeat_ms": 45000}},
        {"op": "ready", "d": {"user_id": "alex", "device_id": "alex-desktop"}},
        # t2 is not followed, t3 is followed with level none, t4 is not readable.
        {"op": "unread", "d": {"threads": [{"thread_id": "t1", "unread": 2}]}},
        {"op": "catchup.complete"},
    ]


async def test_identify_creates_the_device_row_from_the_claims(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch)

    await connect_live(nursery, node, "casey", "casey-laptop", "windows")

    assert await node.sql("SELECT user_id, platform, state FROM bothy.devices") == [
        ("casey", "windows", "active")
    ]
    assert await node.sql("SELECT kind, active FROM bothy.users") == [("human", True)]


async def test_a_bad_token_closes_with_4001(launch: Launch, nursery: trio.Nursery) -> None:
    node = await bare(launch)
    client = await GatewayClient.connect(nursery, gateway_address(node))

    await identify(client, "not-a-jwt")

    assert await client.wait_closed() == (4001, "authentication failed")
    assert closed_total(node, "4001") == 1


async def test_a_revoked_device_is_refused_with_4010(launch: Launch, nursery: trio.Nursery) -> None:
    node = await bare(launch)
    await node.append(
        ev(
            "device.upserted",
            device_id="old-phone",
            user_id="alex",
            platform="ios",
            state="revoked",
        )
    )
    await node.settle()
    client = await GatewayClient.connect(nursery, gateway_address(node))

    await identify(client, device_token("alex", "old-phone", "ios"))

    assert await client.wait_closed() == (4010, "device revoked")
    assert [f["op"] for f in client.frames] == ["hello"]


async def test_revoking_a_connected_device_closes_it_with_4010(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch)
    phone = await connect_live(nursery, node, "alex", "alex-phone", "ios")
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")

    await node.append(
        ev(
            "device.upserted",
            device_id="alex-phone",
            user_id="alex",
            platform="ios",
            state="revoked",
        )
    )
    await node.settle()

    assert await phone.wait_closed() == (4010, "device revoked")
    await desktop.send("ping")
    await desktop.wait_op("pong")
    assert not desktop.ended


async def test_a_second_connection_of_a_device_closes_the_older_with_4017(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch)
    older = await connect_live(nursery, node, "alex", "alex-desktop")

    newer = await connect_live(nursery, node, "alex", "alex-desktop")

    assert await older.wait_closed() == (4017, "replaced by a newer connection")
    await newer.send("ping")
    await newer.wait_op("pong")
    assert gateway_of(node).hub.statistics().live == 1


async def test_no_identify_within_the_identify_timeout_closes_with_4003(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch, sync={"identify_timeout": "200ms"})
    client = await GatewayClient.connect(nursery, gateway_address(node))

    assert await client.wait_closed() == (4003, "identify timeout")


async def test_silence_past_the_heartbeat_closes_with_4009(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch, sync={"heartbeat": "200ms"})
    client = await connect_live(nursery, node, "alex", "alex-desktop")

    assert await client.wait_closed() == (4009, "heartbeat timeout")


async def test_pings_within_the_heartbeat_keep_the_connection_open(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await bare(launch, sync={"heartbeat": "300ms"})
    client = await connect_live(nursery, node, "alex", "alex-desktop")

    for _ in range(10):  # a second: well past one heartbeat timeout (450 ms)
        mark = len(client.frames)
        await client.send("ping")
        assert await client.wait_op("pong", after=mark) == {"op": "pong"}
        await trio.sleep(0.1)

    assert not client.ended


async def test_focus_keeps_only_readable_threads_and_acks_them_in_order(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "sam", "sam-desktop")

    ack = await client.focus(["t2", "t1", "nowhere", "t1"], idle=True)

    assert ack == {"op": "focus.ack", "d": {"thread_ids": ["t1"]}}
    (entry,) = gateway_of(node).presence.entries(["sam"])["sam"]
    assert entry.focus == frozenset({"t1"}) and entry.idle is True


async def test_read_stores_the_position_like_the_http_api_and_never_moves_it_back(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "alex", "alex-desktop")

    assert (await client.read("t1", 5))["d"] == {"thread_id": "t1", "last_read_seq": 5}
    assert (await client.read("t1", 3))["d"] == {"thread_id": "t1", "last_read_seq": 5}

    response = await node.request(
        "PUT", "/v1/threads/t1/read", json={"seq": 4}, token=device_token("alex", "alex-phone")
    )
    assert response.json() == {"thread_id": "t1", "last_read_seq": 5}


async def test_a_full_outbound_queue_drops_ephemeral_frames_counts_them_and_stays_open(
    launch: Launch,
) -> None:
    node = await bare(launch, sync={"outbound_queue_max": 2})
    publisher = gateway_of(node).publisher
    client = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
    try:
        await client.send_json(
            {"op": "identify", "d": {"token": device_token("alex", "alex-desktop", "macos")}}
        )
        assert await client.read_until(lambda f: f.get("op") == "catchup.complete")

        # The client does not read meanwhile: frames go to the socket until it is full,
        # one more waits for the writer, two fit in the queue, the rest are dropped. No
        # checkpoint between the publishes: the writer cannot drain in between.
        queued = [
            await publisher.publish(personal_event("alex", pad="x" * 1_000_000)) for _ in range(20)
        ]

        taken = sum(queued)
        assert queued == [1] * taken + [0] * (20 - taken) and 3 <= taken < 20
        assert gauge(node.metrics, "bothy_gateway_dropped_total", reason="queue_full") == 20 - taken
        assert gateway_of(node).hub.statistics().live == 1
        await client.send_json({"op": "ping"})
        assert await client.read_until(lambda f: f.get("op") == "pong") == {"op": "pong"}
        assert sum(f.get("type") == "notification.created" for f in client.frames) == taken
        assert client.close_code is None
    finally:
        await client.aclose()


async def test_writes_stalled_past_the_write_timeout_close_with_4014(launch: Launch) -> None:
    node = await bare(launch, sync={"write_timeout": "1s", "outbound_queue_max": 8})
    publisher = gateway_of(node).publisher
    client = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
    try:
        await client.send_json(
            {"op": "identify", "d": {"token": device_token("alex", "alex-desktop", "macos")}}
        )
        assert await client.read_until(lambda f: f.get("op") == "catchup.complete")

        # The client stops reading; large frames fill the socket buffers.
        with trio.fail_after(20):
            while closed_total(node, "4014") == 0:
                await publisher.publish(personal_event("alex", pad="x" * 60_000))
                await trio.sleep(0.01)

        assert await client.read_until(lambda f: False) is None
        assert (client.close_code, client.close_reason) == (4014, "writes stalled")
        assert all(f.get("type") == "notification.created" for f in client.frames[4:])
    finally:
        await client.aclose()


async def test_shutdown_closes_connections_with_1001(launch: Launch, nursery: trio.Nursery) -> None:
    node = await bare(launch)
    client = await connect_live(nursery, node, "alex", "alex-desktop")

    node.daemon.request_shutdown()

    assert await client.wait_closed() == (1001, "server shutting down")


async def test_only_the_gateway_path_is_served(launch: Launch) -> None:
    node = await bare(launch)
    host, _, port = gateway_address(node).rpartition(":")
    ws = WSConnection(ConnectionType.CLIENT)

    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(ws.send(Request(host=host, target="/v2/other")))
        with trio.fail_after(5):
            while not (events := list(ws.events())):
                ws.receive_data(await stream.receive_some(4096))

    assert isinstance(events[0], RejectConnection) and events[0].status_code == 404


async def test_connections_are_counted_by_phase(launch: Launch, nursery: trio.Nursery) -> None:
    node = await bare(launch)

    client = await connect_live(nursery, node, "alex", "alex-desktop")
    assert gauge(node.metrics, "bothy_gateway_connections", phase="live") == 1

    await client.close()
    await wait_until(lambda: gateway_of(node).hub.statistics().total == 0)
    for phase in ("connecting", "catching_up", "live", "closing"):
        assert gauge(node.metrics, "bothy_gateway_connections", phase=phase) == 0
    assert closed_total(node, "peer") == 1


async def test_written_hints_record_their_delivery_time_and_metrics_carry_no_ids(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "alex", "alex-desktop")
    await client.focus(["t2"])

    await node.append(message(1))
    await node.settle()
    await client.wait_for(lambda f: f.get("type") == "notification.created")

    count = gauge(node.metrics, "bothy_delivery_seconds_count", route="gateway")
    assert count == 1
    text = node.metrics.render().decode()
    for secret in ("alex", "alex-desktop", "t1", "t2", "s1", "c1", "m1"):
        assert f'"{secret}"' not in text
