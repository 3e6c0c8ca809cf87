"""``message.deleted`` (issue 33, item 2): what the daemon keeps of a deleted message
and what ``last_seq`` does to unread counts and badges; a read position never moves.

End to end: the producer's event -> the round -> ``GET /v1/notifications/unread``
and the tables. What a deletion does to pending sends and to phones is in
``tests/notify/test_deleted_sends.py``.
"""

from __future__ import annotations

from typing import Any

from tests.harness import Launch, Node, device_token, ev


async def world(node: Node) -> None:
    """Alex follows t1 (level all) in space s1 with a phone; Sam writes there."""
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", "alex-token")


def written(seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


def deleted(seq: int, last_seq: int | None = None) -> dict[str, Any]:
    extra = {} if last_seq is None else {"last_seq": last_seq}
    return ev(
        "message.deleted",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
        **extra,
    )


async def unread(node: Node) -> dict[str, Any]:
    answer = await node.request(
        "GET", "/v1/notifications/unread", token=device_token("alex", "alex-phone")
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def last_message(node: Node) -> int:
    ((seq,),) = await node.sql("SELECT last_message_seq FROM bothy.threads WHERE thread_id = 't1'")
    return int(seq)


async def test_last_seq_drops_the_deleted_message_from_unread_counts_and_the_badge(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)
    await node.append(*[written(seq) for seq in (1, 2, 3)])
    await node.settle()
    assert (await unread(node))["threads"][0]["unread"] == 3

    await node.append(deleted(3, last_seq=2))
    await node.settle()

    body = await unread(node)
    assert body["badge"] == 1
    assert body["threads"] == [{"thread_id": "t1", "unread": 2, "last_read_seq": 0}]


async def test_deleting_the_only_unread_message_leaves_nothing_unread(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(
        written(1), written(2), ev("thread.read", user_id="alex", thread_id="t1", seq=1)
    )
    await node.append(deleted(2, last_seq=1))
    await node.settle()

    assert await unread(node) == {"badge": 0, "threads": []}


async def test_a_read_position_never_moves(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(
        written(1), written(2), ev("thread.read", user_id="alex", thread_id="t1", seq=2)
    )
    await node.append(deleted(2, last_seq=1), deleted(1, last_seq=0))
    await node.settle()

    assert await node.sql("SELECT user_id, last_read_seq FROM bothy.read_states") == [("alex", 2)]
    assert await last_message(node) == 0
    assert await unread(node) == {"badge": 0, "threads": []}


async def test_deleting_an_older_message_keeps_the_newest(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(*[written(seq) for seq in (1, 2, 3)])
    await node.append(deleted(1, last_seq=3), deleted(2, last_seq=1))
    await node.settle()

    assert await last_message(node) == 3


async def test_without_last_seq_the_last_message_stays(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(1), written(2), deleted(2))
    await node.settle()

    assert await last_message(node) == 2


async def test_a_deletion_is_kept_as_ids_a_sequence_and_a_time(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(1), deleted(1, last_seq=0), deleted(1, last_seq=0))
    await node.settle()

    rows = await node.sql("SELECT thread_id, message_id, seq FROM bothy.deleted_messages")
    assert rows == [("t1", "m1", 1)]
    ((deleted_at,),) = await node.sql("SELECT deleted_at FROM bothy.threads")
    assert deleted_at == node.clock.now()


async def test_the_sweep_forgets_a_deletion_once_no_job_of_its_message_can_wait(
    launch: Launch,
) -> None:
    node = await launch()  # push.max_age 1h, coalescing off
    await world(node)
    await node.append(written(1), deleted(1))
    await node.settle()
    housekeeper = node.daemon.housekeeper
    assert housekeeper is not None

    node.clock.advance(3599)
    assert (await housekeeper.sweep_now()).deletions_pruned == 0
    node.clock.advance(2)
    assert (await housekeeper.sweep_now()).deletions_pruned == 1

    assert await node.sql("SELECT * FROM bothy.deleted_messages") == []
    assert await node.sql("SELECT deleted_at FROM bothy.threads") == [(None,)]
