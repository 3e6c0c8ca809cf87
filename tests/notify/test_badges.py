"""Badges and urgency in every push, and ``GET /v1/notifications/unread`` (issue 20).

A push's ``badge`` is the number of threads the ``unread`` op would list for the
person when the push is sent; its ``urgency`` the kind's (``[notify.urgency]``).
End to end: producer -> round -> ``notify.push_send`` -> the fake provider.
"""

from __future__ import annotations

from typing import Any

import trio

from tests.harness import Launch, Node, device_token, ev, make_config

NO_COALESCING = {"coalesce_window": "0s"}


async def people(node: Node, threads: int = 3) -> None:
    """Alex follows t1..tN (level all) in space s1, with a phone; Sam writes there."""
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        *[ev("thread.upserted", thread_id=f"t{n}", space_id="s1") for n in range(1, threads + 1)],
        *[
            ev("thread.followed", user_id="alex", thread_id=f"t{n}", level="all")
            for n in range(1, threads + 1)
        ],
    )
    await node.register("alex", "alex-phone", "alex-token")


def message(thread: str, seq: int, *, mentions: tuple[str, ...] = ()) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=list(mentions),
    )


def pushes(node: Node) -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == "alex-token"]


async def unread(node: Node) -> dict[str, Any]:
    answer = await node.request(
        "GET", "/v1/notifications/unread", token=device_token("alex", "alex-phone")
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_each_push_carries_the_unread_threads_counted_when_it_is_sent(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    for thread in ("t1", "t2"):
        await node.append(message(thread, 1))
        await node.settle()
    read = await node.request(
        "PUT", "/v1/threads/t1/read", token=device_token("alex", "alex-desk"), json={"seq": 1}
    )
    assert read.status_code == 200, read.text
    await node.append(message("t2", 2))
    await node.settle()

    assert [(p["thread_id"], p["badge"]) for p in pushes(node)] == [
        ("t1", 1),
        ("t2", 2),
        ("t2", 1),
    ]
    assert await unread(node) == {
        "badge": 1,
        "threads": [{"thread_id": "t2", "unread": 2, "last_read_seq": 0}],
    }


async def test_badge_off_sends_no_badge_member(launch: Launch) -> None:
    node = await launch(config=make_config(push={"badge": "off"}))
    await people(node)
    await node.append(message("t1", 1))
    await node.settle()

    (payload,) = pushes(node)
    assert "badge" not in payload


async def test_each_push_carries_its_kinds_urgency_by_default_and_as_configured(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(notify=NO_COALESCING))
    await people(node)
    await node.append(message("t1", 1), message("t2", 1, mentions=("alex",)))
    await node.settle()
    assert {p["kind"]: p["urgency"] for p in pushes(node)} == {
        "message": "normal",
        "mention": "high",
    }


async def test_configured_urgency_replaces_the_kinds_default(launch: Launch) -> None:
    config = make_config(notify={**NO_COALESCING, "urgency": {"message": "low"}})
    node = await launch(config=config)
    await people(node)
    await node.append(message("t1", 1), message("t2", 1, mentions=("alex",)))
    await node.settle()
    assert {p["kind"]: p["urgency"] for p in pushes(node)} == {
        "message": "low",
        "mention": "high",
    }


async def test_the_unread_call_lists_1000_threads_and_says_truncated_beyond(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(push={"badge": "off"}))
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("member.added", user_id="alex", scope_id="s1"),
    )
    names = [f"t{n:04d}" for n in range(1001)]
    with trio.fail_after(60):
        for start in range(0, len(names), 250):
            chunk = names[start : start + 250]
            await node.append(
                *[ev("thread.upserted", thread_id=t, space_id="s1") for t in chunk],
                *[ev("thread.followed", user_id="alex", thread_id=t, level="all") for t in chunk],
                *[message(t, 1) for t in chunk],
            )
        await node.settle(timeout=60)

    body = await unread(node)
    assert body["badge"] == 1001
    assert body["truncated"] is True
    assert [t["thread_id"] for t in body["threads"]] == names[:1000]


async def test_the_unread_call_refuses_a_request_without_a_device_token(launch: Launch) -> None:
    node = await launch()
    answer = await node.request("GET", "/v1/notifications/unread")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"]
