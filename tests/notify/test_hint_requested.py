"""App-requested hints (``hint.requested``): recipients, filtering, routes and
idempotency, end to end from the producer to the fake provider and gateway."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from bothy_notify.notify.catalogue import Catalogue
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, ev, make_config, producer_token

SOCIAL = make_config(notify={"categories": ["social", "challenges"]})


def friend_request(*recipients: str, **extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "recipients": list(recipients),
        "actor_id": "alex",
        "category": "social",
        "kind": "social:friend_request",
        "target_id": "alex",
    }
    payload.update(extra)
    return ev("hint.requested", **payload)


async def people(node: Node, *names: str) -> None:
    """Active humans, each with a phone registered under token ``<name>-token``."""
    await node.append(*[ev("user.upserted", user_id=n, kind="human", active=True) for n in names])
    for name in names:
        await node.register(name, f"{name}-phone", f"{name}-token")


def pushes(node: Node, name: str) -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == f"{name}-token"]


async def test_app_hint_to_three_people_with_the_actor_among_them_reaches_two(
    launch: Launch,
) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam", "robin")
    await node.append(friend_request("alex", "sam", "robin"))
    await node.settle()

    assert pushes(node, "alex") == []
    for name in ("sam", "robin"):
        (payload,) = pushes(node, name)
        assert payload["kind"] == "social:friend_request"
        assert payload["target_id"] == "alex"
        assert payload["count"] == 1 and payload["quiet"] is False
        assert "thread_id" not in payload and "message_id" not in payload
    assert len(node.fake.sends) == 2


async def test_the_same_request_appended_three_times_gives_one_push(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam")
    for _ in range(3):
        await node.append(friend_request("sam", idempotency_key="fr-alex-sam-1"))
        await node.settle()

    assert len(pushes(node, "sam")) == 1
    assert node.daemon.metrics.hints_deduplicated._value.get() == 2


async def test_retries_inside_one_batch_give_one_push(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam")
    request = friend_request("sam", idempotency_key="fr-alex-sam-1")
    await node.append(request, request, request)
    await node.settle()

    assert len(pushes(node, "sam")) == 1


async def test_without_a_key_kind_target_and_recipient_dedupe_within_the_window(
    launch: Launch,
) -> None:
    config = make_config(notify={"categories": ["social"], "idempotency_window": "1h"})
    node = await launch(config=config)
    await people(node, "alex", "sam", "robin")
    await node.append(friend_request("sam"))
    await node.settle()
    # A retry that names one more person: only the new one hears about it.
    await node.append(friend_request("sam", "robin"))
    await node.settle()
    assert len(pushes(node, "sam")) == 1
    assert len(pushes(node, "robin")) == 1

    await node.advance(3601)
    await node.append(friend_request("sam"))
    await node.settle()
    assert len(pushes(node, "sam")) == 2


async def test_different_keys_or_targets_are_different_hints(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam")
    await node.append(
        friend_request("sam", idempotency_key="first"),
        friend_request("sam", idempotency_key="second"),
        friend_request("sam", target_id="robin"),
        friend_request("sam", target_id="kim"),
    )
    await node.settle()

    assert len(pushes(node, "sam")) == 4


async def test_a_zero_window_turns_deduplication_off(launch: Launch) -> None:
    config = make_config(notify={"categories": ["social"], "idempotency_window": "0s"})
    node = await launch(config=config)
    await people(node, "alex", "sam")
    await node.append(friend_request("sam"), friend_request("sam"))
    await node.settle()

    assert len(pushes(node, "sam")) == 2
    assert await node.sql("SELECT count(*) FROM bothy.hint_idempotency") == [(0,)]


async def test_housekeeping_prunes_idempotency_records_after_the_window(launch: Launch) -> None:
    config = make_config(notify={"categories": ["social"], "idempotency_window": "10m"})
    node = await launch(config=config)
    await people(node, "alex", "sam")
    await node.append(friend_request("sam", idempotency_key="k1"))
    await node.settle()
    housekeeper = node.daemon.housekeeper
    assert housekeeper is not None

    assert (await housekeeper.sweep_now()).idempotency_pruned == 0
    node.clock.advance(601)
    assert (await housekeeper.sweep_now()).idempotency_pruned == 1
    assert await node.sql("SELECT count(*) FROM bothy.hint_idempotency") == [(0,)]


async def test_inactive_and_opted_out_recipients_are_skipped_and_counted(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam", "robin", "kim")
    await node.append(ev("user.upserted", user_id="robin", kind="human", active=False))
    await node.sql(
        "INSERT INTO bothy.preferences (user_id, categories) VALUES (%s, %s)",
        ("kim", Jsonb({"social": False})),
    )
    await node.append(friend_request("sam", "robin", "kim"))
    await node.settle()

    assert len(pushes(node, "sam")) == 1
    assert pushes(node, "robin") == [] and pushes(node, "kim") == []
    assert node.skipped("no_access") == 1
    assert node.skipped("preference") == 1


async def test_a_hint_naming_a_thread_reaches_only_people_with_access(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam", "robin")
    await node.append(
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        friend_request("sam", "robin", kind="social:invite", thread_id="t1"),
    )
    await node.settle()

    (payload,) = pushes(node, "sam")
    assert payload["thread_id"] == "t1" and payload["kind"] == "social:invite"
    assert pushes(node, "robin") == []
    assert node.skipped("no_access") == 1


async def test_live_devices_get_the_gateway_hint_and_the_rest_an_immediate_push(
    launch: Launch,
) -> None:
    gateway = FakeGateway()
    node = await launch(config=SOCIAL, gateway_factory=gateway_factory(gateway))
    await people(node, "alex", "sam")
    gateway.live("sam", "sam-laptop", "macos")
    await node.append(friend_request("sam"))
    await node.settle()

    (hint,) = gateway.hints_for("sam")
    assert hint["kind"] == "social:friend_request" and hint["target_id"] == "alex"
    # The desktop is awake, but a hint without a message is never delayed.
    (push,) = pushes(node, "sam")
    assert push["nid"] == hint["nid"]
    assert [j["args"].get("release_seq", 0) for j in await node.jobs("notify.push_send")] == [0]


async def test_a_kind_the_catalogue_does_not_know_still_delivers(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam")
    assert node.daemon.catalogue.get("challenges:new_format") is None
    await node.append(friend_request("sam", category="challenges", kind="challenges:new_format"))
    await node.settle()

    (payload,) = pushes(node, "sam")
    assert payload["kind"] == "challenges:new_format"


async def test_every_hint_and_push_carries_the_catalogue_version(launch: Launch) -> None:
    gateway = FakeGateway()
    config = make_config(
        notify={
            "categories": ["social"],
            "kinds": {"social:friend_request": {"category": "social", "template": "{count}"}},
        }
    )
    node = await launch(config=config, gateway_factory=gateway_factory(gateway))
    await people(node, "alex", "sam", "robin")
    gateway.live("sam", "sam-laptop", "windows")
    await node.append(friend_request("sam", "robin"))
    await node.settle()

    version = node.daemon.catalogue.version
    assert version != Catalogue.builtin().version
    assert [h["mv"] for h in gateway.hints_for("sam")] == [version]
    assert [p["mv"] for p in pushes(node, "sam") + pushes(node, "robin")] == [version] * 2


async def test_an_unconfigured_category_is_refused_over_http(launch: Launch) -> None:
    node = await launch(config=SOCIAL)
    response = await node.request(
        "POST",
        "/v1/events",
        json={"events": [friend_request("sam", category="sales")]},
        token=producer_token(),
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"] == (
        "events[0].payload.category: not a configured category"
    )
    assert await node.sql("SELECT count(*) FROM bothy.events") == [(0,)]


async def test_an_unconfigured_category_from_the_outbox_is_skipped_in_the_round(
    launch: Launch,
) -> None:
    node = await launch(config=SOCIAL)
    await people(node, "alex", "sam")
    await node.sql(
        "SELECT bothy.append_event('hint.requested', %s)",
        (Jsonb(friend_request("sam", category="sales")["payload"]),),
    )
    await node.settle()

    assert pushes(node, "sam") == []
    assert node.skipped("preference") == 1
