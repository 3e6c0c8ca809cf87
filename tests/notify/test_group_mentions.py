"""Group mentions (issue 33, item 3): ``message.created`` with ``mention_groups``.

``all`` is a ``mention`` for every person with read access to the thread whose
level is not ``none``, never the author; ``here`` only for those of them with a
live connection that is not idle when the round decides. Above
``notify.group_mention_limit`` a group adds nobody and counts
``bothy_group_mentions_refused_total``.

End to end on one node (role ``all``) with the fake gateway's presence and the
fake provider; across nodes in ``tests/cluster/test_group_mentions.py``.
"""

from __future__ import annotations

from typing import Any

from bothy_notify.kernel.presence import PresenceEntry
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, ev, make_config

READERS = ("alex", "robin", "kim", "lee")


async def world(node: Node) -> None:
    """Sam writes in t1 (space s1, channel c1). Alex and Robin read s1, Kim reads c1,
    Lee reads t1 alone, Jo reads another space; Lee silenced t1 (level ``none``).
    Everyone has a phone (token ``<name>-token``)."""
    names = ("sam", *READERS, "jo")
    await node.append(
        *[ev("user.upserted", user_id=n, kind="human", active=True) for n in names],
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="robin", scope_id="s1"),
        ev("member.added", user_id="kim", scope_id="c1"),
        ev("member.added", user_id="lee", scope_id="t1"),
        ev("member.added", user_id="jo", scope_id="s2"),
        ev("thread.followed", user_id="lee", thread_id="t1", level="none"),
    )
    for name in names:
        await node.register(name, f"{name}-phone", f"{name}-token")
    await node.settle()


def message(seq: int, *groups: str, mentions: tuple[str, ...] = ()) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=list(mentions),
        mention_groups=list(groups),
    )


def kinds(node: Node) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for send in node.fake.sends:
        out.setdefault(send.token.removesuffix("-token"), []).append(send.payload["kind"])
    return out


def refused(node: Node) -> float:
    return float(node.daemon.metrics.group_mentions_refused._value.get())


async def test_all_mentions_every_reader_whose_level_is_not_none_but_the_author(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)

    await node.append(message(1, "all"))
    await node.settle()

    assert kinds(node) == {"alex": ["mention"], "robin": ["mention"], "kim": ["mention"]}
    assert refused(node) == 0


async def test_a_reader_following_at_level_all_hears_the_group_mention_as_a_mention(
    launch: Launch,
) -> None:
    node = await launch()
    await world(node)
    await node.append(ev("thread.followed", user_id="alex", thread_id="t1", level="all"))
    await node.append(message(1), message(2, "all"))
    await node.settle()

    alex = {
        s.payload["message_id"]: s.payload["kind"]
        for s in node.fake.sends
        if s.token == "alex-token"
    }
    assert alex == {"m1": "message", "m2": "mention"}


async def test_without_groups_only_followers_and_the_named_hear_of_it(launch: Launch) -> None:
    node = await launch()
    await world(node)

    await node.append(message(1, mentions=("kim",)))
    await node.settle()

    assert kinds(node) == {"kim": ["mention"]}


async def test_an_audience_above_the_limit_adds_nobody_and_is_counted(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"group_mention_limit": 2}))
    await world(node)

    await node.append(message(1, "all", mentions=("robin",)))
    await node.settle()

    assert kinds(node) == {"robin": ["mention"]}  # the named mention still counts
    assert refused(node) == 1
    body = (await node.request("GET", "/metrics")).text
    assert "bothy_group_mentions_refused_total 1.0" in body


async def test_an_audience_at_the_limit_is_mentioned(launch: Launch) -> None:
    node = await launch(config=make_config(notify={"group_mention_limit": 3}))
    await world(node)

    await node.append(message(1, "all"))
    await node.settle()

    assert set(kinds(node)) == {"alex", "robin", "kim"}
    assert refused(node) == 0


async def test_here_mentions_only_readers_live_and_not_idle(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("alex", "alex-desk", "linux")  # live, not idle
    gateway.live("robin", "robin-desk", "linux", idle=True)  # live, idle
    gateway.live("jo", "jo-desk", "linux")  # live, cannot read t1
    # Kim is offline.

    await node.append(message(1, "here"))
    await node.settle()

    assert [h["kind"] for h in gateway.hints_for("alex")] == ["mention"]
    assert gateway.hints_for("robin") == [] and gateway.hints_for("jo") == []
    assert kinds(node) == {"alex": ["mention"]}  # a linux desktop does not delay the phone


async def test_here_counts_only_the_present_against_the_limit(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(
        gateway_factory=gateway_factory(gateway),
        config=make_config(notify={"group_mention_limit": 1}),
    )
    await world(node)
    gateway.live("alex", "alex-desk", "linux")

    await node.append(message(1, "all", "here"))
    await node.settle()
    assert [h["kind"] for h in gateway.hints_for("alex")] == ["mention"]
    assert refused(node) == 1  # "all" was refused, "here" was not

    gateway.live("kim", "kim-desk", "linux")
    await node.append(message(2, "here"))
    await node.settle()
    assert len(gateway.hints_for("alex")) == 1 and gateway.hints_for("kim") == []
    assert refused(node) == 2


async def test_here_is_decided_with_the_presence_of_the_round(launch: Launch) -> None:
    gateway = FakeGateway()
    node = await launch(gateway_factory=gateway_factory(gateway))
    await world(node)
    gateway.live("alex", "alex-desk", "linux")
    await node.append(message(1, "here"))
    await node.settle()
    gateway.presence.set("alex")
    gateway.presence.set("robin", PresenceEntry("robin-desk", "linux", frozenset(), False))

    await node.append(message(2, "here"))
    await node.settle()

    assert [h["message_id"] for h in gateway.hints_for("alex")] == ["m1"]
    assert [h["message_id"] for h in gateway.hints_for("robin")] == ["m2"]
