"""A real Synapse homeserver pushes through the daemon's Matrix push gateway.

Synapse (``tests/interop/synapse.py``: installed into a cached virtualenv by ``make
interop``, started on SQLite on 127.0.0.1) has two users in a room; one of them sets
an HTTP pusher pointing at the daemon's ``/_matrix/push/v1/notify`` (an app mapped to
APNs, the fake APNs behind it). The other one's message reaches the fake APNs as one
content-free push for that event; a pushkey the fake declares Unregistered is listed
in ``rejected``, and Synapse removes that pusher.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from bothy_notify.kernel.clock import FakeClock
from testkit.fakes.apns import Answer, ApnsRequest, FakeApns
from tests.harness import Launch, make_config
from tests.interop.synapse import Homeserver
from tests.push.conftest import ApnsKey
from tests.push.test_delivery import apns

APP = "im.bothy.interop.ios"
PUSHKEY = "ab" * 32
GONE = "cd" * 32
SECRET = "a message text that must never reach a phone"
WAIT = 60.0
"""Seconds Synapse may take to push (it pushes within about a second here)."""


async def until(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    with trio.move_on_after(WAIT):
        while not await predicate():
            await trio.sleep(0.2)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def test_synapse_pushes_one_content_free_push_and_drops_a_rejected_pusher(
    launch: Launch,
    nursery: trio.Nursery,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    tmp_path: Path,
) -> None:
    node = await launch(
        config=make_config(matrix_gateway={"apps": {APP: "apns"}}),
        providers={"apns": apns(fake_apns, apns_key, ca_file, now_clock)},
        clock=now_clock,
    )
    gateway = f"{node.api}/_matrix/push/v1/notify"
    homeserver = Homeserver(tmp_path)
    await nursery.start(homeserver.start)
    alice = await homeserver.register("alice")
    bob = await homeserver.register("bob")
    room = await homeserver.create_room(alice, bob)
    await homeserver.set_pusher(bob, app_id=APP, pushkey=PUSHKEY, url=gateway)

    event_id = await homeserver.send_text(alice, room, SECRET)

    def of_event() -> list[ApnsRequest]:
        return [r for r in fake_apns.requests if r.body.get("event_id") == event_id]

    async def pushed() -> bool:
        return bool(of_event())

    await until(pushed, "the push of the event")
    (push,) = of_event()
    assert push.device_token == PUSHKEY
    assert push.body["event_id"] == event_id
    assert push.body["room_id"] == room
    assert push.body["unread"] >= 1
    assert SECRET not in str(push.body) and "alice" not in str(push.body)

    # A second device of Bob whose token APNs declares gone: the gateway lists it in
    # rejected and Synapse removes the pusher.
    fake_apns.answer(GONE, Answer(410, "Unregistered"))
    await homeserver.set_pusher(bob, app_id=APP, pushkey=GONE, url=gateway)
    await homeserver.send_text(alice, room, "another one")

    async def removed() -> bool:
        return [p["pushkey"] for p in await homeserver.pushers(bob)] == [PUSHKEY]

    await until(removed, "Synapse to remove the rejected pusher")
    assert [r.status for r in fake_apns.requests if r.device_token == GONE] == [410]
    gone = await node.sql(
        "SELECT invalidated_at IS NOT NULL, last_error FROM bothy.push_registrations"
        " WHERE token = %s",
        (GONE,),
    )
    assert gone == [(True, "Unregistered")]
