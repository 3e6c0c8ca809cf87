"""What a deleted message (``message.deleted``, issue 33 item 2) does to what is not
sent yet, and to the phones that were pushed for its thread.

- Nothing not yet sent for it goes out: a push still queued, a delayed push, a
  gateway hint still queued, a coalescing flush that would count only deleted
  messages; each is skipped ``deleted`` (``bothy_push_skipped_total``).
- Phones pushed for the thread since their last clear get one ``removed`` push
  after ``push.clear_delay`` (one per burst), or the ``read`` clear when nothing of
  the thread is left unread for the person.

End to end: producer -> round -> jobs -> the fake provider and the fake gateway's
recorded frames, on the fake clock.
"""

from __future__ import annotations

from typing import Any

from tests.api.test_admin import status
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, device_token, ev, make_config, two_followed_threads

DELAY = 120.0
"""``notify.mobile_delay_when_desktop_active`` of the test configuration."""


async def world(node: Node) -> None:
    """Alex follows t1 and t2 (level all) in space s1, with a phone (``alex-token``);
    Sam writes there."""
    await node.append(*two_followed_threads())
    await node.register("alex", "alex-phone", "alex-token")
    await node.settle()


def written(seq: int, thread: str = "t1") -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


def deleted(seq: int, last_seq: int | None = None, thread: str = "t1") -> dict[str, Any]:
    extra = {} if last_seq is None else {"last_seq": last_seq}
    return ev(
        "message.deleted",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
        **extra,
    )


def pushes(node: Node) -> list[dict[str, Any]]:
    """The hints pushed to Alex's phone (not the removed and read pushes)."""
    return [
        s.payload
        for s in node.fake.sends
        if s.token == "alex-token" and s.payload["kind"] in ("message", "mention")
    ]


# ---------------------------------------------------------------- not yet sent


async def test_a_push_still_queued_when_its_message_is_deleted_is_not_sent(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)

    await node.append(written(1), deleted(1, last_seq=0))  # one round: the push is queued
    await node.settle()

    assert pushes(node) == []
    assert node.skipped("deleted") == 1
    metrics = (await node.request("GET", "/metrics")).text
    assert 'bothy_push_skipped_total{reason="deleted"} 1.0' in metrics
    assert (await status(node))["skips"]["deleted"] == 1  # the status page's table


async def test_a_delayed_push_of_a_deleted_message_is_not_sent(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("alex", "alex-desk", "macos")
    await node.append(written(1))
    await node.settle()
    assert [h["message_id"] for h in gateway.hints_for("alex")] == ["t1-m1"]

    await node.append(deleted(1, last_seq=0))
    await node.settle()
    await node.advance(DELAY)

    assert pushes(node) == []
    assert node.skipped("deleted") == 1


async def test_a_delayed_push_of_another_message_still_goes(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("alex", "alex-desk", "macos")
    await node.append(written(1), written(2))
    await node.settle()

    await node.append(deleted(2, last_seq=1))
    await node.settle()
    await node.advance(DELAY)

    assert [p["message_id"] for p in pushes(node)] == ["t1-m1"]
    assert node.skipped("deleted") == 1


async def test_a_gateway_hint_still_queued_is_not_published(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("alex", "alex-desk", "linux")

    await node.append(written(1), deleted(1))
    await node.settle()

    assert gateway.hints_for("alex") == []
    finished = node.daemon.metrics.registry.get_sample_value(
        "bothy_jobs_finished_total", {"kind": "notify.gateway_send", "result": "skipped_deleted"}
    )
    assert finished == 1
    assert node.skipped("deleted") == 2  # the gateway hint and the phone's push


async def test_a_flush_that_would_count_only_deleted_messages_says_nothing(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify={"coalesce_window": "30s"}))
    await world(node)
    await node.append(written(1))
    await node.settle()
    await node.append(written(2), written(3))
    await node.settle()

    await node.append(deleted(3, last_seq=2), deleted(2, last_seq=1))
    await node.settle()
    await node.advance(31)

    assert [p["message_id"] for p in pushes(node)] == ["t1-m1"]
    assert node.skipped("deleted") == 1


async def test_a_flush_with_a_message_left_still_tells_of_it(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"coalesce_window": "30s"}))
    await world(node)
    await node.append(written(1))
    await node.settle()
    await node.append(written(2), written(3))
    await node.settle()

    await node.append(deleted(3, last_seq=2))
    await node.settle()
    await node.advance(31)

    flush = [p for p in pushes(node) if p.get("message_id") != "t1-m1"]
    # Its newest folded message went: it tells of the thread, up to its last message.
    assert len(flush) == 1 and flush[0]["count"] == 2 and "message_id" not in flush[0]
    assert node.skipped("deleted") == 0


# ---------------------------------------------------------------- the phone


def removals(node: Node) -> list[dict[str, Any]]:
    return [
        s.payload
        for s in node.fake.sends
        if s.token == "alex-token" and s.payload["kind"] in ("removed", "read")
    ]


async def test_a_phone_pushed_for_the_thread_gets_one_removed_push_after_the_clear_delay(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(push={"clear_delay": "5s"}))
    await world(node)
    await node.append(written(1), written(2), written(1, thread="t2"))
    await node.settle()

    await node.append(deleted(2, last_seq=1))
    await node.settle()
    assert removals(node) == []
    await node.advance(5)

    assert removals(node) == [
        {"kind": "removed", "thread_id": "t1", "message_id": "t1-m2", "badge": 2, "urgency": "low"}
    ]


async def test_a_burst_of_deletions_sends_one_removed_push_naming_the_latest(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)
    await node.append(*[written(seq) for seq in range(1, 6)])
    await node.settle()

    for seq in (5, 4, 3):
        await node.append(deleted(seq, last_seq=seq - 1))
        await node.settle()
        node.clock.advance(0.2)
    await node.advance(2)

    (push,) = removals(node)
    assert push["kind"] == "removed" and push["message_id"] == "t1-m3"
    assert len(await node.jobs("notify.push_removed")) == 1


async def test_with_nothing_left_unread_the_phone_gets_the_read_clear(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(1), written(2))
    await node.settle()
    read = await node.request(  # on the phone itself: its mark stays, no clear is queued
        "PUT", "/v1/threads/t1/read", token=device_token("alex", "alex-phone"), json={"seq": 1}
    )
    assert read.status_code == 200, read.text

    await node.append(deleted(2, last_seq=1))
    await node.settle()
    await node.advance(2)

    assert removals(node) == [
        {"kind": "read", "thread_id": "t1", "seq": 1, "badge": 0, "urgency": "low"}
    ]
    await node.append(deleted(1, last_seq=0))  # the clear removed the mark: nothing more
    await node.settle()
    await node.advance(2)
    assert len(removals(node)) == 1


async def test_a_phone_never_pushed_for_the_thread_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(1, thread="t2"))
    await node.settle()
    await node.register("alex", "alex-tablet", "tablet-token")

    await node.append(written(1), deleted(1, last_seq=0))
    await node.settle()
    await node.advance(2)

    assert removals(node) == []
    assert [s for s in node.fake.sends if s.token == "tablet-token"] == []


async def test_clear_on_read_false_sends_no_removed_push(launch: Launch) -> None:
    node = await launch(config=make_config(push={"clear_on_read": False}))
    await world(node)
    await node.append(written(1), written(2))
    await node.settle()

    await node.append(deleted(2, last_seq=1))
    await node.settle()
    await node.advance(2)

    assert removals(node) == []
    assert await node.jobs("notify.push_removed") == []
