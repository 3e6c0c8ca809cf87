"""Clear-on-read (issue 20): a read moving forward sends one content-free ``read``
push to each of the person's other registrations that were pushed for the thread.

End to end: producer -> round -> ``notify.push_send`` (marks) -> a read (HTTP, the
``thread.read`` event) -> ``notify.push_clear`` -> the fake provider, on the fake
clock (``push.clear_delay`` is waited for by advancing it, never by sleeping).
"""

from __future__ import annotations

from typing import Any

from bothy_notify.store import marks
from tests.harness import Launch, Node, device_token, ev, make_config, two_followed_threads

NO_COALESCING = {"coalesce_window": "0s"}


async def people(node: Node) -> None:
    """Alex follows t1 and t2 (level all) in space s1; Sam writes there. Alex's phone
    and desktop are registered."""
    await node.append(*two_followed_threads())
    await node.register("alex", "alex-phone", "phone-token")
    await node.register("alex", "alex-desk", "desk-token", platform="macos")


def message(thread: str, seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


def reads_to(node: Node, token: str) -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == token and s.payload["kind"] == "read"]


async def read_on_desk(node: Node, thread: str, seq: int) -> None:
    answer = await node.request(
        "PUT",
        f"/v1/threads/{thread}/read",
        token=device_token("alex", "alex-desk", "macos"),
        json={"seq": seq},
    )
    assert answer.status_code == 200, answer.text


async def pushed(node: Node, *messages: dict[str, Any]) -> None:
    await node.append(*messages)
    await node.settle()


async def test_a_read_on_the_desktop_sends_one_read_push_to_the_pushed_phone(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1), message("t1", 2), message("t2", 1))

    await read_on_desk(node, "t1", 2)
    await node.advance(2)

    assert reads_to(node, "phone-token") == [
        {"kind": "read", "thread_id": "t1", "seq": 2, "badge": 1, "urgency": "low"}
    ]


async def test_the_reading_devices_own_registration_gets_no_read_push(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1))

    await read_on_desk(node, "t1", 1)
    await node.advance(2)

    assert [s.payload["kind"] for s in node.fake.sends if s.token == "desk-token"] == ["message"]
    assert len(reads_to(node, "phone-token")) == 1


async def test_a_phone_never_pushed_for_the_thread_gets_no_read_push(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1))
    await node.register("alex", "alex-tablet", "tablet-token")

    await read_on_desk(node, "t1", 1)
    await node.advance(2)

    assert len(reads_to(node, "phone-token")) == 1
    assert [s for s in node.fake.sends if s.token == "tablet-token"] == []


async def test_clear_on_read_false_sends_no_read_push(launch: Launch) -> None:
    config = make_config(notify=NO_COALESCING, push={"clear_on_read": False})
    node = await launch(config=config)
    await people(node)
    await pushed(node, message("t1", 1))

    await read_on_desk(node, "t1", 1)
    await node.advance(2)

    assert reads_to(node, "phone-token") == []
    assert await node.jobs("notify.push_clear") == []


async def test_five_reads_within_the_delay_send_one_push_with_the_newest_seq(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, *[message("t1", seq) for seq in range(1, 6)])

    for seq in range(1, 6):
        await read_on_desk(node, "t1", seq)
        node.clock.advance(0.2)
    await node.advance(2)

    assert [p["seq"] for p in reads_to(node, "phone-token")] == [5]
    assert len(await node.jobs("notify.push_clear")) == 1


async def test_the_read_push_waits_for_the_clear_delay(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING, push={"clear_delay": "10s"}))
    await people(node)
    await pushed(node, message("t1", 1))

    await read_on_desk(node, "t1", 1)
    await node.advance(9)
    assert reads_to(node, "phone-token") == []
    await node.advance(1)
    assert len(reads_to(node, "phone-token")) == 1


async def test_a_delivered_read_push_clears_the_mark_so_the_next_read_sends_none(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1), message("t1", 2))
    await read_on_desk(node, "t1", 1)
    await node.advance(2)

    await read_on_desk(node, "t1", 2)
    await node.advance(2)

    assert [p["seq"] for p in reads_to(node, "phone-token")] == [1]


async def test_the_thread_read_event_clears_every_pushed_registration(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1))

    await node.append(ev("thread.read", user_id="alex", thread_id="t1", seq=1))
    await node.settle()
    await node.advance(2)

    assert len(reads_to(node, "phone-token")) == 1
    assert len(reads_to(node, "desk-token")) == 1


async def test_a_read_that_does_not_move_forward_sends_nothing(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1), message("t1", 2))
    await read_on_desk(node, "t1", 2)
    await node.advance(2)
    await pushed(node, message("t1", 3))

    await read_on_desk(node, "t1", 1)
    await node.advance(2)

    assert [p["seq"] for p in reads_to(node, "phone-token")] == [2]


async def test_marks_go_when_their_registration_is_deleted(launch: Launch) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await pushed(node, message("t1", 1))
    assert len(await node.sql("SELECT 1 FROM bothy.push_marks")) == 2

    await node.sql("DELETE FROM bothy.push_registrations WHERE token = 'phone-token'")

    assert len(await node.sql("SELECT 1 FROM bothy.push_marks")) == 1


async def test_one_pair_marked_twice_in_one_batch_is_one_mark(launch: Launch) -> None:
    node = await launch()
    await people(node)
    ((registration_id,),) = await node.sql(
        "SELECT id FROM bothy.push_registrations WHERE token = 'phone-token'"
    )
    pair = (str(registration_id), "t1")

    await node.db.run(lambda c: marks.record_many(c, [pair, pair], node.clock.now()))

    assert await node.sql("SELECT registration_id, thread_id FROM bothy.push_marks") == [pair]
