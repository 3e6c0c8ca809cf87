"""Local gateway hints: on a node that decides and holds the connections (role
``all``), the round inserts the gateway hints it decides already claimed by this
node and hands them to the runner after its commit, checked on the round's
connection (``LocalGatewayHints``). The in-memory publisher records whether the
caller vouched for the read-access check."""

from __future__ import annotations

import trio

from bothy_notify.kernel.ephemeral import EphemeralEvent, RecordingPublisher
from bothy_notify.kernel.presence import PresenceEntry
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, ev, make_config

GATEWAY_SEND = "notify.gateway_send"


class VouchingPublisher(RecordingPublisher):
    """Records, beside each event, whether the caller had checked read access itself."""

    def __init__(self) -> None:
        super().__init__()
        self.access_checked: list[bool] = []

    async def publish(self, event: EphemeralEvent, *, access_checked: bool = False) -> int:
        self.access_checked.append(access_checked)
        return await super().publish(event, access_checked=access_checked)


async def start(launch: Launch) -> tuple[Node, FakeGateway, VouchingPublisher]:
    gateway = FakeGateway()
    publisher = gateway.publisher = VouchingPublisher()
    node = await launch(
        gateway_factory=gateway_factory(gateway),
        config=make_config(notify={"mobile_delay_when_desktop_active": "0s"}),
    )
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.settle()
    gateway.presence.set("alex", PresenceEntry("desk", "macos", frozenset(), False))
    return node, gateway, publisher


def message(seq: int) -> dict[str, object]:
    return ev(
        "message.created", thread_id="t1", message_id=f"m{seq}", thread_seq=seq, author_id="sam"
    )


async def gateway_rows(node: Node) -> list[tuple[object, ...]]:
    return await node.sql(
        "SELECT state, attempt, claim, lease_until IS NULL, last_error FROM bothy.jobs"
        " WHERE kind = %s ORDER BY id",
        (GATEWAY_SEND,),
    )


async def test_a_hint_decided_here_is_published_with_the_rounds_check(launch: Launch) -> None:
    node, _gateway, publisher = await start(launch)
    await node.append(message(1))
    await node.settle()

    (event,) = publisher.events
    assert event.payload["message_id"] == "m1"
    assert event.scope == {"thread_id": "t1", "space_id": "s1", "channel_id": "c1"}
    assert publisher.access_checked == [True]  # checked after the commit, no second query
    assert await gateway_rows(node) == [("completed", 1, 1, True, None)]


async def test_access_removed_later_in_the_same_round_stops_the_hint(launch: Launch) -> None:
    node, _gateway, publisher = await start(launch)
    # One append: the message is decided before the removal is applied (log order),
    # so its job is written; the check after the commit sees the removal.
    await node.append(message(1), ev("member.removed", user_id="alex", scope_id="s1"))
    await node.settle()

    assert publisher.events == []
    assert node.skipped("no_access") == 1
    assert await gateway_rows(node) == [("completed", 1, 1, True, None)]


async def test_a_runner_that_stopped_claiming_leaves_the_hint_to_its_claim(
    launch: Launch,
) -> None:
    node, _gateway, publisher = await start(launch)
    assert node.daemon.runner is not None
    node.daemon.runner.stop_claiming()
    await node.append(message(1))
    with trio.fail_after(10):
        while not await gateway_rows(node):
            await trio.sleep(0.01)
    assert await gateway_rows(node) == [("available", 0, 0, True, None)]
    assert publisher.events == []
