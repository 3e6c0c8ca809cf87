"""A device is identified by (person, device id) (SPEC section 14): two people whose
tokens carry the same device id never replace, revoke or silence each other, over
real gateway connections and the HTTP API."""

from __future__ import annotations

import trio

from bothy_notify.store.db import Conn, Database
from gateway import queries
from gateway.revocations import revoked_device
from gateway.service import build_gateway
from tests.gateway.client import connect_live, gateway_of
from tests.harness import Launch, Node, device_token, ev, make_config

SHARED = "shared-phone"
"""The device id both people's tokens carry."""


async def two_people(launch: Launch) -> Node:
    """Alex and Sam follow t1; each registered a phone whose device id is ``SHARED``."""
    node = await launch(gateway_factory=build_gateway, config=make_config())
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
        ev("thread.followed", user_id="sam", thread_id="t1", level="all"),
    )
    await node.register("alex", SHARED, "alex-token")
    await node.register("sam", SHARED, "sam-token")
    return node


def revoke(user: str) -> dict[str, object]:
    return ev("device.upserted", device_id=SHARED, user_id=user, platform="ios", state="revoked")


async def registration_states(node: Node, user: str) -> list[str]:
    response = await node.request(
        "GET", "/v1/registrations", token=device_token(user, "another-device")
    )
    assert response.status_code == 200
    return [r["state"] for r in response.json()["registrations"]]


async def test_two_people_with_the_same_device_id_do_not_replace_each_others_connection(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await two_people(launch)
    alex = await connect_live(nursery, node, "alex", SHARED, "ios")
    sam = await connect_live(nursery, node, "sam", SHARED, "ios")

    for client in (alex, sam):
        await client.send("ping")
        await client.wait_op("pong")
        assert not client.ended
    assert gateway_of(node).hub.statistics().live == 2
    assert sorted(gateway_of(node).hub.devices()) == [("alex", SHARED), ("sam", SHARED)]


async def test_a_second_connection_replaces_only_the_same_persons_device(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await two_people(launch)
    older = await connect_live(nursery, node, "alex", SHARED, "ios")
    sam = await connect_live(nursery, node, "sam", SHARED, "ios")

    await connect_live(nursery, node, "alex", SHARED, "ios")

    assert await older.wait_closed() == (4017, "replaced by a newer connection")
    await sam.send("ping")
    await sam.wait_op("pong")
    assert not sam.ended


async def test_revoking_one_persons_device_leaves_the_others_connected_and_registered(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await two_people(launch)
    alex = await connect_live(nursery, node, "alex", SHARED, "ios")
    sam = await connect_live(nursery, node, "sam", SHARED, "ios")

    await node.append(revoke("alex"))
    await node.settle()

    assert await alex.wait_closed() == (4010, "device revoked")
    await sam.send("ping")
    await sam.wait_op("pong")
    assert not sam.ended
    assert await registration_states(node, "alex") == ["invalidated"]
    assert await registration_states(node, "sam") == ["active"]
    assert (
        node.daemon.metrics.registry.get_sample_value(
            "bothy_registrations_invalidated_total", {"cause": "device_revoked"}
        )
        == 1
    )


async def test_a_revoked_device_is_refused_only_for_its_own_person(launch: Launch) -> None:
    node = await two_people(launch)
    await node.append(revoke("alex"))
    await node.settle()

    refused = await node.request("GET", "/v1/registrations", token=device_token("alex", SHARED))
    served = await node.request("GET", "/v1/registrations", token=device_token("sam", SHARED))

    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "device_revoked"
    assert served.status_code == 200
    rows = await node.sql(
        "SELECT user_id, state FROM bothy.devices WHERE device_id = %s ORDER BY user_id",
        (SHARED,),
    )
    assert rows == [("alex", "revoked"), ("sam", "active")]


async def test_the_other_person_still_gets_pushes_after_a_revocation(launch: Launch) -> None:
    node = await two_people(launch)
    await node.append(revoke("alex"))
    await node.append(
        ev(
            "message.created",
            thread_id="t1",
            message_id="m1",
            thread_seq=1,
            author_id="robin",
            mentions=[],
        )
    )
    await node.settle()

    assert [s.token for s in node.fake.sends] == ["sam-token"]


def test_a_revocation_notification_names_the_person_and_the_device() -> None:
    assert revoked_device('{"user_id":"alex","device_id":"d1"}') == ("alex", "d1")


def test_a_revocation_notification_without_both_ids_is_ignored() -> None:
    for payload in ("d1", '{"device_id":"d1"}', '{"user_id":1,"device_id":"d1"}', "[]"):
        assert revoked_device(payload) is None


async def test_the_listener_finds_only_the_revoked_persons_device_after_a_reconnect(
    db: Database,
) -> None:
    def seed(conn: Conn) -> set[tuple[str, str]]:
        conn.execute(
            "INSERT INTO bothy.devices (user_id, device_id, platform, state)"
            " VALUES ('alex', %s, 'ios', 'revoked'), ('sam', %s, 'ios', 'active')",
            (SHARED, SHARED),
        )
        return queries.revoked_among(conn, [("alex", SHARED), ("sam", SHARED)])

    assert await db.run(seed) == {("alex", SHARED)}
