"""``GET``/``PUT /v1/preferences``: category switches, and what decisions make of them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, device_token, ev, make_config

SOCIAL = make_config(notify={"categories": ["social"]})
PHONE = device_token("alex", "alex-phone")
LAPTOP = device_token("alex", "alex-laptop", "macos")
ALL_ON = {"messages": True, "mentions": True, "security": True, "admin": True, "social": True}


async def put(node: Node, body: Any, token: str = PHONE) -> Any:
    return await node.request("PUT", "/v1/preferences", json=body, token=token)


async def get(node: Node, token: str = PHONE) -> dict[str, Any]:
    response = await node.request("GET", "/v1/preferences", token=token)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


async def test_a_person_who_never_chose_has_every_category_on(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    assert await get(node) == {"categories": ALL_ON}


async def test_put_switches_the_named_categories_and_keeps_the_others(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    first = await put(node, {"categories": {"social": False, "admin": False}})
    assert first.status_code == 200
    assert first.json() == {"categories": {**ALL_ON, "social": False, "admin": False}}

    second = await put(node, {"categories": {"admin": True, "messages": False}})
    assert second.json() == {"categories": {**ALL_ON, "social": False, "messages": False}}


async def test_preferences_follow_the_person_to_every_device(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await put(node, {"categories": {"mentions": False}}, token=PHONE)
    assert (await get(node, token=LAPTOP))["categories"]["mentions"] is False
    assert (await get(node, token=device_token("sam", "sam-phone")))["categories"] == ALL_ON


async def test_security_cannot_be_switched_off_and_nothing_changes(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    response = await put(node, {"categories": {"social": False, "security": False}})
    assert response.status_code == 422
    assert response.json() == {
        "error": {"code": "invalid", "message": "categories.security: cannot be switched off"}
    }
    assert await get(node) == {"categories": ALL_ON}
    # Saying it stays on is fine.
    assert (await put(node, {"categories": {"security": True}})).status_code == 200


async def test_an_unknown_category_is_refused_and_nothing_changes(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    response = await put(node, {"categories": {"messages": False, "sales": False}})
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "invalid",
        "message": "categories: unknown category",
    }
    assert await get(node) == {"categories": ALL_ON}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "categories: required"),
        ({"categories": []}, "categories: expected an object"),
        ({"categories": {"social": "no"}}, "categories.social: expected true or false"),
        ({"categories": {}, "level": "all"}, "(body): unknown field"),
        ([], "(body): expected an object"),
    ],
)
async def test_a_wrong_shape_is_422_naming_the_field(
    launch: Launch, body: Any, message: str
) -> None:
    node = await launch(config=SOCIAL)
    response = await put(node, body)
    assert response.status_code == 422
    assert response.json() == {"error": {"code": "invalid", "message": message}}


async def test_category_off_stops_gateway_and_push_but_security_still_arrives(
    launch: Launch,
) -> None:
    gateway = FakeGateway()
    node = await launch(config=SOCIAL, gateway_factory=gateway_factory(gateway))
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", "alex-token")
    gateway.live("alex", "alex-laptop", "macos")
    assert (await put(node, {"categories": {"messages": False}})).status_code == 200

    await node.append(
        ev("message.created", thread_id="t1", message_id="m1", thread_seq=1, author_id="sam")
    )
    await node.settle()
    assert gateway.hints_for("alex") == []
    assert await node.jobs() == []
    assert node.skipped("preference") == 1

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
    assert [h["kind"] for h in gateway.hints_for("alex")] == ["security"]
    assert [s.payload["kind"] for s in node.fake.sends] == ["security"]


async def test_mentions_switched_off_turns_a_mention_into_a_plain_message_for_level_all(
    launch: Launch,
) -> None:
    node = await launch(config=SOCIAL)
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", "alex-token")
    await put(node, {"categories": {"mentions": False}})
    await node.append(
        ev(
            "message.created",
            thread_id="t1",
            message_id="m1",
            thread_seq=1,
            author_id="sam",
            mentions=["alex"],
        )
    )
    await node.settle()

    assert [s.payload["kind"] for s in node.fake.sends] == ["message"]
