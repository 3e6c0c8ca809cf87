"""``GET``/``PUT /v1/threads/{id}/follow``: follow levels, and what decisions make of them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import Launch, Node, device_token, ev, make_config

PHONE = device_token("alex", "alex-phone")


async def follow(node: Node, thread: str, body: Any, token: str = PHONE) -> Any:
    return await node.request("PUT", f"/v1/threads/{thread}/follow", json=body, token=token)


async def level_of(node: Node, thread: str, token: str = PHONE) -> dict[str, Any]:
    response = await node.request("GET", f"/v1/threads/{thread}/follow", token=token)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def readable_thread(node: Node, *people: str) -> None:
    """Thread t1 in space s1, which ``people`` (alex by default) may read."""
    await node.append(
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        *(ev("member.added", user_id=p, scope_id="s1") for p in people or ("alex",)),
    )
    await node.settle()


async def test_without_a_stored_level_the_answer_is_notify_default_level(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"default_level": "all"}))
    await readable_thread(node)
    assert await level_of(node, "t1") == {"thread_id": "t1", "level": "all", "is_default": True}


async def test_a_stored_level_is_answered_and_only_for_its_person(launch: Launch) -> None:
    node = await launch()
    await readable_thread(node, "alex", "sam")
    response = await follow(node, "t1", {"level": "none"})
    assert response.status_code == 200
    assert response.json() == {"thread_id": "t1", "level": "none", "is_default": False}

    assert await level_of(node, "t1") == {"thread_id": "t1", "level": "none", "is_default": False}
    other = await level_of(node, "t1", token=device_token("sam", "sam-phone"))
    assert other == {"thread_id": "t1", "level": "mentions", "is_default": True}


async def test_the_api_and_the_thread_followed_event_write_one_projection(launch: Launch) -> None:
    node = await launch()
    await readable_thread(node)
    await node.append(ev("thread.followed", user_id="alex", thread_id="t1", level="all"))
    await node.settle()
    assert (await level_of(node, "t1"))["level"] == "all"

    await follow(node, "t1", {"level": "mentions"})
    rows = await node.sql("SELECT user_id, thread_id, level FROM bothy.follows")
    assert rows == [("alex", "t1", "mentions")]


@pytest.mark.parametrize(
    ("thread", "body", "message"),
    [
        ("t1", {"level": "loud"}, "level: expected all, mentions or none"),
        ("t1", {"level": ["all"]}, "level: expected all, mentions or none"),
        ("t1", {}, "level: required"),
        ("t1", {"level": "all", "why": 1}, "(body): unknown field"),
        ("t1", "all", "(body): expected an object"),
    ],
)
async def test_a_wrong_follow_request_is_422_naming_the_field(
    launch: Launch, thread: str, body: Any, message: str
) -> None:
    node = await launch()
    response = await follow(node, thread, body)
    assert response.status_code == 422
    assert response.json() == {"error": {"code": "invalid", "message": message}}
    assert await node.sql("SELECT count(*) FROM bothy.follows") == [(0,)]


async def test_a_thread_id_of_another_form_is_404_like_a_missing_thread(launch: Launch) -> None:
    # SPEC section 14: a path id of any form is 404, never a field error.
    node = await launch()
    response = await follow(node, "t%20one", {"level": "all"})
    assert response.status_code == 404
    assert response.json() == {"error": {"code": "not_found", "message": "no such thread"}}
    assert await node.sql("SELECT count(*) FROM bothy.follows") == [(0,)]


async def world(node: Node) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
    )
    await node.register("alex", "alex-phone", "alex-token")
    await node.settle()  # the membership is projected: alex may read t1 and set a level


def message(seq: int, mentions: list[str]) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=mentions,
    )


async def test_level_none_silences_the_thread_even_for_mentions(launch: Launch) -> None:
    node = await launch()
    await world(node)
    assert (await follow(node, "t1", {"level": "none"})).status_code == 200
    await node.append(message(1, []), message(2, ["alex"]))
    await node.settle()

    assert node.fake.sends == []
    assert node.skipped("preference") == 1  # the mention; the plain message had no candidate


async def test_level_mentions_lets_only_mentions_through(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"default_level": "all"}))
    await world(node)
    assert (await follow(node, "t1", {"level": "mentions"})).status_code == 200
    await node.append(message(1, []), message(2, ["alex"]), message(3, []))
    await node.settle()

    assert [(s.payload["kind"], s.payload["message_id"]) for s in node.fake.sends] == [
        ("mention", "m2")
    ]


async def test_level_all_hears_every_message(launch: Launch) -> None:
    node = await launch()
    await world(node)
    assert (await follow(node, "t1", {"level": "all"})).status_code == 200
    await node.append(message(1, []), message(2, []))
    await node.settle()

    assert sorted(s.payload["message_id"] for s in node.fake.sends) == ["m1", "m2"]
