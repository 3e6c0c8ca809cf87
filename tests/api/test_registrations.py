"""``POST /v1/registrations``: hand-over of device tokens, a registration limit per
person, and token lengths per provider (SPEC section 9)."""

from __future__ import annotations

import httpx
import pytest

from bothy_notify.api.registrations import LIMIT_REACHED, TOKEN_MAX
from bothy_notify.push.fake import FakeProvider
from tests.harness import Launch, Node, device_token, ev, make_config


async def post(node: Node, user: str, token: str, *, device: str = "phone") -> httpx.Response:
    return await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "fake", "token": token},
        token=device_token(user, device),
    )


def counted(node: Node, action: str) -> float:
    value = node.daemon.metrics.registry.get_sample_value(
        "bothy_registrations_total", {"action": action}
    )
    return value or 0.0


async def test_a_device_token_of_another_person_moves_to_the_caller(launch: Launch) -> None:
    node = await launch()
    first = await post(node, "alex", "shared-token")
    moved = await post(node, "sam", "shared-token")

    assert (first.status_code, moved.status_code) == (201, 200)
    assert moved.json()["id"] == first.json()["id"]
    listed = await node.request("GET", "/v1/registrations", token=device_token("alex", "phone"))
    assert listed.json() == {"registrations": []}
    assert counted(node, "registered") == 2  # new for Alex, then new for Sam


async def test_a_person_may_hold_at_most_the_configured_number_of_registrations(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(push={"max_registrations_per_person": 3}))
    for i in range(3):
        assert (await post(node, "alex", f"token-{i}", device=f"d{i}")).status_code == 201

    refused = await post(node, "alex", "token-3", device="d3")

    assert refused.status_code == 409
    assert refused.json() == {"error": {"code": "too_many_registrations", "message": LIMIT_REACHED}}
    assert "token-3" not in refused.text
    rows = await node.sql("SELECT count(*) FROM bothy.push_registrations WHERE user_id = 'alex'")
    assert rows == [(3,)]


async def test_registering_a_known_token_again_is_not_a_new_registration(launch: Launch) -> None:
    node = await launch(config=make_config(push={"max_registrations_per_person": 2}))
    await post(node, "alex", "token-0", device="d0")
    await post(node, "alex", "token-1", device="d1")

    again = await post(node, "alex", "token-1", device="d1")

    assert again.status_code == 200


async def test_a_token_moving_to_a_person_at_the_limit_is_refused_and_stays(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(push={"max_registrations_per_person": 1}))
    await post(node, "alex", "alex-token")
    await post(node, "sam", "sam-token")

    refused = await post(node, "sam", "alex-token")

    assert refused.status_code == 409
    rows = await node.sql("SELECT user_id FROM bothy.push_registrations WHERE token = 'alex-token'")
    assert rows == [("alex",)]


async def test_invalidated_registrations_make_room_for_a_new_one(launch: Launch) -> None:
    node = await launch(config=make_config(push={"max_registrations_per_person": 2}))
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await post(node, "alex", "dead-old-phone", device="old")
    await post(node, "alex", "tablet", device="tablet")
    await node.append(
        ev(
            "message.created",
            thread_id="t1",
            message_id="m1",
            thread_seq=1,
            author_id="sam",
            mentions=[],
        )
    )
    await node.settle()  # the old phone's token is dead: invalidated, kept as evidence

    created = await post(node, "alex", "new-phone", device="new")

    assert created.status_code == 201
    rows = await node.sql(
        "SELECT token FROM bothy.push_registrations WHERE user_id = 'alex' ORDER BY token"
    )
    assert rows == [("new-phone",), ("tablet",)]
    assert counted(node, "deleted") == 1


@pytest.mark.parametrize(
    ("provider", "length"), [("fake", TOKEN_MAX["fake"] + 1), ("apns", TOKEN_MAX["apns"] + 2)]
)
async def test_a_token_longer_than_its_provider_allows_is_422_naming_the_field(
    launch: Launch, provider: str, length: int
) -> None:
    # Any provider object will do: the request is refused before a send.
    node = await launch(providers={"fake": FakeProvider(), "apns": FakeProvider()})
    token = "ab" * (length // 2) if provider == "apns" else "x" * length

    response = await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": provider, "token": token},
        token=device_token("alex", "phone"),
    )

    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["message"].startswith("token: longer than")
    assert token not in response.text


async def test_a_token_of_three_thousand_characters_is_stored_and_found_again(
    launch: Launch,
) -> None:
    node = await launch()
    token = "t" * 3000

    first = await post(node, "alex", token)
    again = await post(node, "alex", token)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]


@pytest.mark.parametrize("field", ["environment", "app_id", "signing_key", "token"])
async def test_a_member_given_as_null_is_422_naming_it(launch: Launch, field: str) -> None:
    node = await launch()
    body = {"provider": "fake", "token": "tok-null", field: None}
    answer = await node.request(
        "POST", "/v1/registrations", json=body, token=device_token("alex", "phone")
    )
    assert answer.status_code == 422
    assert answer.json()["error"] == {"code": "invalid", "message": f"{field}: must not be null"}
    assert await node.sql("SELECT count(*) FROM bothy.push_registrations") == [(0,)]
