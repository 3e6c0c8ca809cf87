"""``message.edited`` (issue 33, item 1): each person the edit newly mentions (in
``mentions``, not in ``previous_mentions``, never the author) gets one ``mention``
hint, decided like a new message's mention; nobody else gets anything, however
often the message is edited.

End to end: the producer's event -> the round -> the jobs -> the fake provider
(and, for presence, the fake gateway's recorded ``notification.created``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from bothy_notify.kernel.presence import PresenceEntry
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, device_token, ev, make_config


async def world(node: Node) -> None:
    """Sam writes in t1 (space s1); Alex, Robin and Kim read s1, nobody follows t1
    (``default_level = "mentions"``); each has a phone (token ``<name>-token``)."""
    names = ("sam", "alex", "robin", "kim")
    await node.append(
        *[ev("user.upserted", user_id=n, kind="human", active=True) for n in names],
        *[ev("member.added", user_id=n, scope_id="s1") for n in names],
        ev("thread.upserted", thread_id="t1", space_id="s1"),
    )
    for name in names:
        await node.register(name, f"{name}-phone", f"{name}-token")
    await node.settle()


def written(seq: int = 1, mentions: tuple[str, ...] = ()) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=list(mentions),
    )


def edited(mentions: tuple[str, ...], previous: tuple[str, ...], seq: int = 1) -> dict[str, Any]:
    return ev(
        "message.edited",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=list(mentions),
        previous_mentions=list(previous),
    )


def pushes(node: Node, name: str) -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == f"{name}-token"]


async def test_a_newly_mentioned_person_gets_one_mention_and_nobody_else_anything(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)
    await node.append(written(mentions=("alex",)))
    await node.settle()
    sent = len(node.fake.sends)

    await node.append(edited(("alex", "robin", "sam"), previous=("alex",)))
    await node.settle()

    (payload,) = pushes(node, "robin")
    assert payload["kind"] == "mention"
    assert payload["thread_id"] == "t1" and payload["message_id"] == "m1"
    assert payload["count"] == 1 and payload["quiet"] is False
    assert len(node.fake.sends) == sent + 1  # not Alex again, not Sam, not Kim


async def test_editing_again_and_again_mentions_each_person_once(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written())
    await node.append(edited(("robin",), previous=()))
    await node.append(edited((), previous=("robin",)))
    await node.append(edited(("robin",), previous=()), edited(("robin", "kim"), previous=()))
    await node.settle()

    assert [p["kind"] for p in pushes(node, "robin")] == ["mention"]
    assert [p["kind"] for p in pushes(node, "kim")] == ["mention"]
    assert node.daemon.metrics.hints_deduplicated._value.get() == 2


async def test_the_author_mentioned_by_the_edit_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(), edited(("sam",), previous=()))
    await node.settle()

    assert pushes(node, "sam") == []


async def test_a_person_who_read_past_the_message_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(written(1), written(2))
    await node.append(ev("thread.read", user_id="robin", thread_id="t1", seq=2))
    await node.append(edited(("robin",), previous=(), seq=1))
    await node.settle()

    assert pushes(node, "robin") == []
    assert node.skipped("read") == 1


async def test_a_person_without_access_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(ev("member.removed", user_id="robin", scope_id="s1"))
    await node.append(written(), edited(("robin",), previous=()))
    await node.settle()

    assert pushes(node, "robin") == []
    assert node.skipped("no_access") == 1


async def test_a_follower_who_turned_mentions_off_hears_nothing_not_a_message(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)
    await node.sql(
        "INSERT INTO bothy.preferences (user_id, categories) VALUES (%s, %s)",
        ("robin", Jsonb({"mentions": False})),
    )
    await node.append(ev("thread.followed", user_id="robin", thread_id="t1", level="all"))
    await node.append(written())
    await node.settle()
    assert [p["kind"] for p in pushes(node, "robin")] == ["message"]

    await node.append(edited(("robin",), previous=()))
    await node.settle()

    assert [p["kind"] for p in pushes(node, "robin")] == ["message"]
    assert node.skipped("preference") == 1


async def test_a_level_none_follower_gets_nothing(launch: Launch) -> None:
    node = await launch()
    await world(node)
    await node.append(ev("thread.followed", user_id="robin", thread_id="t1", level="none"))
    await node.append(written(), edited(("robin",), previous=()))
    await node.settle()

    assert pushes(node, "robin") == []


async def test_while_a_desktop_is_active_the_phone_waits_and_the_desktop_hears_it(
    launch: Launch,
) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("robin", "robin-desk", "macos")
    await node.append(written(), edited(("robin",), previous=()))
    await node.settle()

    (hint,) = gateway.hints_for("robin")
    assert hint["kind"] == "mention" and hint["message_id"] == "m1"
    assert pushes(node, "robin") == []
    (delayed,) = [j for j in await node.jobs("notify.push_send") if j["args"]["user_id"] == "robin"]
    assert delayed["args"]["release_seq"] == 1 and delayed["state"] == "available"


async def test_a_person_active_in_the_thread_is_not_disturbed(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.presence.set("robin", PresenceEntry("robin-desk", "macos", frozenset({"t1"}), False))
    await node.append(written(), edited(("robin",), previous=()))
    await node.settle()

    assert gateway.hints_for("robin") == [] and pushes(node, "robin") == []
    assert node.skipped("active_in_thread") == 1


async def test_an_edit_inside_an_open_window_folds_into_it(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"coalesce_window": "30s"}))
    await world(node)
    await node.append(ev("thread.followed", user_id="robin", thread_id="t1", level="all"))
    await node.append(written(1))
    await node.settle()
    await node.append(written(2), edited(("robin",), previous=(), seq=2))
    await node.settle()

    assert [p["kind"] for p in pushes(node, "robin")] == ["message"]
    await node.advance(31)
    assert [(p["kind"], p["quiet"]) for p in pushes(node, "robin")] == [
        ("message", False),
        ("mention", False),
    ]


async def test_a_person_in_quiet_hours_hears_it_quietly_and_the_phone_is_held(
    launch: Launch,
) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("robin", "robin-desk", "linux")
    until = (node.clock.now() + timedelta(minutes=30)).isoformat().replace("+00:00", "Z")
    answer = await node.request(
        "PUT",
        "/v1/quiet-hours",
        token=device_token("robin", "robin-phone"),
        json={"snooze_until": until},
    )
    assert answer.status_code == 200, answer.text

    await node.append(written(), edited(("robin",), previous=()))
    await node.settle()

    (hint,) = gateway.hints_for("robin")
    assert hint["kind"] == "mention" and hint["quiet"] is True
    assert pushes(node, "robin") == []
    assert await node.sql("SELECT user_id, thread_id FROM bothy.held_pushes") == [("robin", "t1")]
