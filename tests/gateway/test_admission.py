"""Admission: which live connections a ``notification.created`` may reach."""

from __future__ import annotations

from datetime import UTC, datetime

import trio

from bothy_notify.kernel.ephemeral import EphemeralEvent
from bothy_notify.kernel.ids import new_id
from tests.gateway.client import connect_live, gateway_of, gauge
from tests.gateway.world import start
from tests.harness import Launch, ev


def event(audience: str, resource_kind: str, resource_id: str) -> EphemeralEvent:
    return EphemeralEvent(
        type="notification.created",
        id=new_id(),
        occurred_at=datetime.now(UTC),
        audience=audience,
        resource_kind=resource_kind,
        resource_id=resource_id,
        payload={"nid": new_id(), "kind": "message", "quiet": False, "count": 1},
    )


async def test_a_hint_without_a_thread_reaches_only_its_person(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop")
    agent = await connect_live(nursery, node, "alex", "alex-bot", "linux", kind="agent")
    other = await connect_live(nursery, node, "sam", "sam-desktop")

    await node.append(ev("access.expiring", user_id="alex", target_id="grant-7"))
    await node.settle()

    hint = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert hint["resource"] == {"kind": "user", "id": "alex"} and hint["scope"] == {}
    assert hint["payload"]["kind"] == "admin" and hint["payload"]["target_id"] == "grant-7"
    assert "thread_id" not in hint["payload"]
    for client in (agent, other):
        await client.send("ping")
        await client.wait_op("pong")
        assert client.notifications() == []


async def test_a_device_waiting_for_approval_is_announced_to_the_persons_other_devices(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop")
    tablet = await connect_live(nursery, node, "alex", "alex-tablet", "ios")

    await node.append(
        ev(
            "device.upserted",
            device_id="alex-tablet",
            user_id="alex",
            platform="ios",
            state="pending",
        )
    )
    await node.settle()

    hint = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert hint["payload"]["kind"] == "security"
    assert hint["payload"]["target_id"] == "alex-tablet"
    await tablet.send("ping")
    await tablet.wait_op("pong")
    assert tablet.notifications() == []


async def test_a_personal_event_is_refused_unless_its_resource_is_the_audience(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await connect_live(nursery, node, "alex", "alex-desktop")
    publisher = gateway_of(node).publisher

    assert await publisher.publish(event("alex", "user", "sam")) == 0
    assert await publisher.publish(event("alex", "user", "alex")) == 1
    assert gauge(node.metrics, "bothy_gateway_dropped_total", reason="not_admitted") == 1


async def test_the_hub_refuses_a_thread_hint_once_read_access_is_gone(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    sam = await connect_live(nursery, node, "sam", "sam-desktop")
    alex = await connect_live(nursery, node, "alex", "alex-desktop")
    publisher = gateway_of(node).publisher

    await node.append(ev("member.removed", user_id="sam", scope_id="c1"))
    await node.settle()

    assert await publisher.publish(event("sam", "thread", "t1")) == 0
    assert await publisher.publish(event("alex", "thread", "t1")) == 1
    await alex.wait_for(lambda f: f.get("type") == "notification.created")
    await sam.send("ping")
    await sam.wait_op("pong")
    assert sam.notifications() == []
    assert gauge(node.metrics, "bothy_gateway_dropped_total", reason="not_admitted") == 1


async def test_a_hint_reaches_every_live_device_of_its_person(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    assert await gateway_of(node).publisher.publish(event("alex", "thread", "t1")) == 2

    for client in (desktop, laptop):
        await client.wait_for(lambda f: f.get("type") == "notification.created")
