"""End to end: which route a hint takes while desktops and phones are connected.

Real daemon (role ``all``), real gateway on 127.0.0.1:0, real PostgreSQL, a
fake clock for the desktop delay, and the fake provider.
"""

from __future__ import annotations

from datetime import timedelta

import trio

from bothy_notify.kernel.clock import to_unix_micros
from testkit.ws import GatewayClient
from tests.gateway.client import connect_live, gateway_address, gateway_of, wait_until
from tests.gateway.world import (
    DELAY,
    GATEWAY_SEND,
    PUSH_SEND,
    jobs_for,
    message,
    pushes,
    start,
)
from tests.harness import Launch, device_token, ev


async def test_thread_in_focus_on_a_non_idle_desktop_gives_no_hint_anywhere(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t1"])

    await node.append(message(1))
    await node.settle()

    assert await jobs_for(node, PUSH_SEND) == []
    assert await jobs_for(node, GATEWAY_SEND) == []
    assert node.skipped("active_in_thread") == 1
    await node.advance(DELAY)
    assert pushes(node) == []
    assert desktop.notifications() == []


async def test_a_live_phone_focusing_the_thread_also_stops_every_hint(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    phone = await connect_live(nursery, node, "alex", "alex-phone", "ios")
    await phone.focus(["t1"])

    await node.append(message(1))
    await node.settle()

    assert await jobs_for(node, PUSH_SEND) == []
    assert await jobs_for(node, GATEWAY_SEND) == []
    assert node.skipped("active_in_thread") == 1
    assert pushes(node) == []


async def test_an_idle_desktop_gets_the_gateway_hint_and_the_phone_an_immediate_push(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t1"], idle=True)

    await node.append(message(1))
    await node.settle()

    (job,) = await jobs_for(node, PUSH_SEND)
    assert job["args"]["release_seq"] == 0 and job["scheduled_at"] == node.clock.now()
    assert len(await jobs_for(node, GATEWAY_SEND)) == 1
    (hint,) = (await desktop.wait_for(lambda f: f.get("type") == "notification.created"),)
    (push,) = pushes(node)
    assert push["nid"] == hint["payload"]["nid"]


async def test_focus_moved_away_before_the_message_gives_a_desktop_hint_and_a_delayed_push(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t1"])
    await desktop.focus([])

    await node.append(message(1))
    await node.settle()

    await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    (job,) = await jobs_for(node, PUSH_SEND)
    assert job["scheduled_at"] == node.clock.now() + timedelta(seconds=DELAY)
    assert pushes(node) == []
    await node.advance(DELAY)
    assert len(pushes(node)) == 1


async def test_message_read_on_the_active_desktop_before_the_delay_is_never_pushed(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    decided_at = node.clock.now()

    await node.append(message(1))
    await node.settle()

    (job,) = await jobs_for(node, PUSH_SEND)
    args = job["args"]
    assert job["scheduled_at"] == decided_at + timedelta(seconds=DELAY)
    assert args["due_at"] == to_unix_micros(decided_at + timedelta(seconds=DELAY))
    assert args["release_seq"] == 1
    hint = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert {k: v for k, v in hint["payload"].items() if k != "mv"} == {
        "nid": args["nid"],
        "kind": "message",
        "thread_id": "t1",
        "message_id": "m1",
        "quiet": False,
        "count": 1,
    }
    assert "seq" not in hint and "permission_version" not in hint
    assert hint["audience"] == "alex" and hint["resource"] == {"kind": "thread", "id": "t1"}
    assert hint["scope"] == {"space_id": "s1", "channel_id": "c1", "thread_id": "t1"}

    ack = await desktop.read("t1", 1)
    assert ack["d"] == {"thread_id": "t1", "last_read_seq": 1}
    await node.advance(DELAY)

    assert pushes(node) == []
    assert node.skipped("read") == 1


async def test_an_unread_message_is_pushed_once_after_the_delay_with_the_desktop_hints_nid(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])

    await node.append(message(1))
    await node.settle()
    hint = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    await node.advance(DELAY - 1)
    assert pushes(node) == []
    await node.advance(1)

    (push,) = pushes(node)
    assert push["nid"] == hint["payload"]["nid"]


async def test_reading_only_up_to_an_earlier_message_still_pushes_the_later_one(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])

    await node.append(message(1), message(2))
    await node.settle()
    await desktop.wait_for(lambda f: f.get("payload", {}).get("message_id") == "m2")
    await desktop.read("t1", 1)
    await node.advance(DELAY)

    (push,) = pushes(node)
    assert push["message_id"] == "m2"
    assert node.skipped("read") == 1


async def test_a_zero_desktop_delay_pushes_at_once(launch: Launch, nursery: trio.Nursery) -> None:
    node = await start(launch, notify={"mobile_delay_when_desktop_active": "0s"})
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])

    await node.append(message(1))
    await node.settle()

    assert len(pushes(node)) == 1
    await desktop.wait_for(lambda f: f.get("type") == "notification.created")


async def test_only_a_windows_laptop_live_gets_the_hint_and_delays_the_phone(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    await node.append(message(1))
    await node.settle()

    await laptop.wait_for(lambda f: f.get("type") == "notification.created")
    (job,) = await jobs_for(node, PUSH_SEND)
    assert job["args"]["release_seq"] == 1
    assert job["scheduled_at"] == node.clock.now() + timedelta(seconds=DELAY)
    assert pushes(node) == []


async def test_nobody_live_pushes_at_once_and_publishes_nothing(launch: Launch) -> None:
    node = await start(launch)

    await node.append(message(1))
    await node.settle()

    assert len(pushes(node)) == 1
    assert await jobs_for(node, GATEWAY_SEND) == []


async def test_a_desktop_still_catching_up_counts_as_offline(launch: Launch) -> None:
    node = await start(launch)
    # A catch-up too large for a client that is not reading yet: twenty thousand
    # followed threads with an unread message each (fixture rows).
    await node.sql(
        "WITH t AS (SELECT 'bulk-' || i AS id FROM generate_series(1, 20000) AS i),"
        " a AS (INSERT INTO bothy.threads (thread_id, space_id, last_message_seq)"
        "  SELECT id, 's1', 1 FROM t)"
        " INSERT INTO bothy.follows (thread_id, user_id, level) SELECT id, 'alex', 'all' FROM t"
    )
    gateway = gateway_of(node)
    desktop = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
    try:
        await desktop.send_json(
            {"op": "identify", "d": {"token": device_token("alex", "alex-desktop", "macos")}}
        )
        await wait_until(lambda: gateway.hub.statistics().catching_up == 1)

        await node.append(message(1))
        await node.settle()

        assert len(pushes(node)) == 1
        assert await jobs_for(node, GATEWAY_SEND) == []
        assert gateway.hub.statistics().catching_up == 1

        assert await desktop.read_until(lambda f: f.get("op") == "catchup.complete")
        await wait_until(lambda: gateway.hub.statistics().live == 1)
        assert [f for f in desktop.frames if f.get("type")] == []
    finally:
        await desktop.aclose()


async def test_revocation_between_decision_and_publish_publishes_nothing(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "sam", "sam-desktop", "macos")

    # One batch: the round decides with access, then applies the removal; the
    # gateway job runs after the commit and finds no access any more.
    await node.append(message(1), ev("member.removed", user_id="sam", scope_id="c1"))
    await node.settle()

    assert len(await jobs_for(node, GATEWAY_SEND, "sam")) == 1
    assert node.skipped("no_access") == 1
    await desktop.send("ping")
    await desktop.wait_op("pong")
    assert desktop.notifications() == []


async def test_ten_messages_in_a_window_give_one_hint_then_a_flush_hint_with_the_unread_count(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, notify={"coalesce_window": "30s"})
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])

    await node.append(*[message(seq) for seq in range(1, 11)])
    await node.settle()
    first = await desktop.wait_for(lambda f: f.get("type") == "notification.created")
    assert len(await jobs_for(node, GATEWAY_SEND)) == 1
    (delayed,) = await jobs_for(node, PUSH_SEND)
    assert delayed["args"]["release_seq"] == 1

    await node.advance(30)

    flush = await desktop.wait_for(
        lambda f: f.get("type") == "notification.created" and f is not first
    )
    assert flush["payload"]["count"] == 10 and flush["payload"]["message_id"] == "m10"
    assert flush["payload"]["nid"] != first["payload"]["nid"]
    second = [j for j in await jobs_for(node, PUSH_SEND) if j["id"] != delayed["id"]]
    assert len(second) == 1
    assert second[0]["args"]["release_seq"] == 10
    assert second[0]["args"]["nid"] == flush["payload"]["nid"]
    assert second[0]["scheduled_at"] == node.clock.now() + timedelta(seconds=DELAY)


async def test_reading_before_the_window_ends_gives_no_flush_hint(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, notify={"coalesce_window": "30s"})
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])
    await node.append(*[message(seq) for seq in range(1, 11)])
    await node.settle()
    await desktop.wait_for(lambda f: f.get("type") == "notification.created")

    await desktop.read("t1", 10)
    await node.advance(30)
    await node.advance(DELAY)

    assert len(desktop.notifications()) == 1
    assert len(await jobs_for(node, GATEWAY_SEND)) == 1
    assert pushes(node) == []
    assert node.skipped("read") == 1
