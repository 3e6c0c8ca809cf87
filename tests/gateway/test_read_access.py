"""The ``read`` op stores a read position only for a thread the person can read;
otherwise ``read.ack`` carries the position already stored (0 when none) and
nothing changes, whether or not the thread exists."""

from __future__ import annotations

import trio

from tests.gateway.client import connect_live
from tests.gateway.world import start
from tests.harness import Launch, ev


async def test_read_of_a_thread_that_does_not_exist_stores_nothing(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "sam", "sam-desktop")

    ack = await client.read("nowhere", 5)

    assert ack == {"op": "read.ack", "d": {"thread_id": "nowhere", "last_read_seq": 0}}
    assert await node.sql("SELECT count(*) FROM bothy.read_states") == [(0,)]


async def test_read_of_a_thread_the_person_cannot_read_gets_the_same_answer(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "sam", "sam-desktop")  # sam reads c1 only

    ack = await client.read("t2", 5)

    assert ack == {"op": "read.ack", "d": {"thread_id": "t2", "last_read_seq": 0}}
    assert await node.sql("SELECT count(*) FROM bothy.read_states") == [(0,)]


async def test_after_losing_access_the_stored_position_stays_and_is_answered(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "sam", "sam-desktop")
    assert (await client.read("t1", 3))["d"]["last_read_seq"] == 3

    await node.append(ev("member.removed", user_id="sam", scope_id="c1"))
    await node.settle()
    ack = await client.read("t1", 9)

    assert ack["d"] == {"thread_id": "t1", "last_read_seq": 3}
    assert await node.sql("SELECT last_read_seq FROM bothy.read_states") == [(3,)]
