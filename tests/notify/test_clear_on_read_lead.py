"""Clear-on-read (issue 20) seen from outside, written apart from the
implementation: through ``PUT /v1/threads/{id}/read``, a ``thread.read`` event
and the gateway's ``read`` op, one ``read`` push per registration pushed for the
thread since its last clear (never the reader's) after ``push.clear_delay``, and
``read.updated`` to the person's other live connections; the fake clock moves
the delay."""

from __future__ import annotations

from typing import Any

import trio

from gateway.service import build_gateway
from tests.gateway.client import connect_live
from tests.harness import Launch, Node, device_token, ev, make_config, two_followed_threads


async def world(launch: Launch, **push: Any) -> Node:
    """Alex follows t1 and t2 (level all) with a phone; Sam writes there. The node
    runs the real gateway."""
    node = await launch(gateway_factory=build_gateway, config=make_config(push=push))
    await node.append(*two_followed_threads())
    await node.register("alex", "alex-phone", "phone-token")
    return node


def message(seq: int, thread: str = "t1") -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


def clears(node: Node, token: str = "phone-token") -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == token and s.payload["kind"] == "read"]


async def read(node: Node, seq: int, device: str = "alex-desk", thread: str = "t1") -> None:
    answer = await node.request(
        "PUT", f"/v1/threads/{thread}/read", token=device_token("alex", device), json={"seq": seq}
    )
    assert answer.status_code == 200, answer.text


async def test_a_read_elsewhere_sends_one_read_push_to_the_phone_that_was_pushed(
    launch: Launch,
) -> None:
    node = await world(launch)
    await node.append(message(1), message(1, "t2"))
    await node.settle()
    await node.register("alex", "alex-tablet", "tablet-token")  # never pushed for t1
    await read(node, 1)
    await node.settle()
    assert clears(node) == []  # not before push.clear_delay
    await node.advance(2)

    assert clears(node) == [
        {"kind": "read", "thread_id": "t1", "seq": 1, "badge": 1, "urgency": "low"}
    ]
    assert clears(node, "tablet-token") == []


async def test_the_reading_devices_own_registration_gets_no_read_push(launch: Launch) -> None:
    node = await world(launch)
    await node.append(message(1))
    await node.settle()
    await read(node, 1, device="alex-phone")
    await node.advance(2)
    assert clears(node) == []


async def test_clear_on_read_off_sends_no_read_push(launch: Launch) -> None:
    node = await world(launch, clear_on_read=False)
    await node.append(message(1))
    await node.settle()
    await read(node, 1)
    await node.advance(2)
    assert clears(node) == []


async def test_five_reads_within_the_delay_send_one_push_with_the_newest_position(
    launch: Launch,
) -> None:
    node = await world(launch)
    await node.append(*[message(n) for n in range(1, 6)])
    await node.settle()
    for seq in range(1, 6):
        await read(node, seq)
        node.clock.advance(0.3)
    await node.advance(2)
    assert [(c["seq"], c["badge"]) for c in clears(node)] == [(5, 0)]


async def test_a_second_read_without_a_new_push_sends_nothing_more(launch: Launch) -> None:
    node = await world(launch)
    await node.append(message(1), message(2))
    await node.settle()
    await read(node, 1)
    await node.advance(2)
    await read(node, 2)
    await node.advance(2)
    assert [c["seq"] for c in clears(node)] == [1]


async def test_a_read_position_that_does_not_move_sends_nothing(launch: Launch) -> None:
    node = await world(launch)
    await node.append(message(1))
    await node.settle()
    await read(node, 1)
    await node.advance(2)
    await node.append(message(2))
    await node.settle()
    await read(node, 1)  # not forward: the phone's new push stays
    await node.advance(2)
    assert [c["seq"] for c in clears(node)] == [1]


async def test_a_thread_read_event_clears_the_phone_too(launch: Launch) -> None:
    node = await world(launch)
    await node.append(message(1))
    await node.settle()
    await node.append(ev("thread.read", user_id="alex", thread_id="t1", seq=1))
    await node.settle()
    await node.advance(2)
    assert [c["seq"] for c in clears(node)] == [1]


async def test_read_updated_reaches_the_other_connection_and_not_the_reader(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await world(launch)
    await node.append(message(1), message(1, "t2"))
    await node.settle()
    reader = await connect_live(nursery, node, "alex", "alex-desk", "linux")
    other = await connect_live(nursery, node, "alex", "alex-laptop", "linux")
    ack = await reader.read("t1", 1)
    assert ack["d"]["last_read_seq"] == 1
    frame = await other.wait_for(lambda f: f.get("type") == "read.updated")
    assert frame["audience"] == "alex"
    assert frame["resource"] == {"kind": "thread", "id": "t1"}
    assert frame["payload"] == {"thread_id": "t1", "seq": 1, "badge": 1}
    assert set(frame) == {"type", "id", "occurred_at", "audience", "resource", "payload"}
    await node.settle()
    assert not [f for f in reader.frames if f.get("type") == "read.updated"]
    # The phone was pushed for t1 and the read was on a desktop: it is cleared too.
    await node.advance(2)
    assert [c["seq"] for c in clears(node)] == [1]
