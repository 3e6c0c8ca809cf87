"""``notification.removed`` (issue 33, item 2): a deleted message reaches the live
connections of its candidates (followers at level ``all``, the mentioned) as one
frame with the envelope of ``notification.created`` and the badge of after the
deletion; nobody else's.

Real daemon (role ``all``), real gateway on 127.0.0.1:0, real PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import trio

from tests.gateway.client import GatewayClient, connect_live
from tests.gateway.world import message, start
from tests.harness import Launch, ev

Frame = dict[str, Any]


def deleted(seq: int, *, last_seq: int | None = None, mentions: tuple[str, ...] = ()) -> Frame:
    payload: dict[str, Any] = {
        "thread_id": "t1",
        "message_id": f"m{seq}",
        "thread_seq": seq,
        "author_id": "robin",
        "mentions": list(mentions),
    }
    if last_seq is not None:
        payload["last_seq"] = last_seq
    return ev("message.deleted", **payload)


def removed(client: GatewayClient) -> list[Frame]:
    return [f for f in client.frames if f.get("type") == "notification.removed"]


async def wait_removed(client: GatewayClient) -> Frame:
    return await client.wait_for(lambda f: f.get("type") == "notification.removed")


async def test_a_followers_desktop_gets_the_frame_with_the_new_badge(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await node.append(message(1), message(2))
    await node.settle()
    created = await desktop.wait_for(lambda f: f.get("type") == "notification.created")

    await node.append(deleted(2, last_seq=1))
    await node.settle()
    frame = await wait_removed(desktop)

    assert (
        set(frame)
        == set(created)
        == {
            "type",
            "id",
            "occurred_at",
            "audience",
            "resource",
            "scope",
            "payload",
        }
    )
    assert frame["audience"] == "alex"
    assert frame["resource"] == {"kind": "thread", "id": "t1"}
    assert (
        frame["scope"]
        == created["scope"]
        == {
            "thread_id": "t1",
            "space_id": "s1",
            "channel_id": "c1",
        }
    )
    assert frame["payload"] == {"thread_id": "t1", "message_id": "m2", "badge": 1}


async def test_the_badge_drops_when_the_deleted_message_was_the_only_unread_one(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await node.append(message(1))
    await node.settle()

    await node.append(deleted(1, last_seq=0))
    await node.settle()

    assert (await wait_removed(desktop))["payload"]["badge"] == 0


async def test_the_author_and_non_candidates_get_nothing(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    await node.append(ev("member.added", user_id="robin", scope_id="s1"))
    robin = await connect_live(nursery, node, "robin", "robin-desktop", "macos")
    sam = await connect_live(nursery, node, "sam", "sam-desktop", "macos")
    alex = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    await node.append(ev("thread.followed", user_id="sam", thread_id="t1", level="mentions"))
    await node.append(message(1), deleted(1))
    await node.settle()

    await wait_removed(alex)
    await alex.read("t2", 0)  # a round trip later: any other frame would be in by now
    await sam.read("t2", 0)
    await robin.read("t2", 0)
    assert removed(robin) == [] and removed(sam) == []


async def test_a_mentioned_person_gets_the_frame(launch: Launch, nursery: trio.Nursery) -> None:
    node = await start(launch)
    await node.append(ev("thread.followed", user_id="sam", thread_id="t1", level="mentions"))
    sam = await connect_live(nursery, node, "sam", "sam-desktop", "macos")

    await node.append(deleted(3, mentions=("sam",)))
    await node.settle()

    assert (await wait_removed(sam))["payload"]["message_id"] == "m3"


async def test_every_live_connection_of_the_person_gets_it(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    desktop = await connect_live(nursery, node, "alex", "alex-desktop", "macos")
    laptop = await connect_live(nursery, node, "alex", "alex-laptop", "windows")

    await node.append(message(1), deleted(1))
    await node.settle()

    await wait_removed(desktop)
    await wait_removed(laptop)
