"""A ``POST /v1/events`` on the node that holds the consumer round wakes the round in
the process instead of by ``NOTIFY bothy_events`` (``store.appender``): the hint
arrives without the poll interval, and no notification is sent for the append."""

from __future__ import annotations

from typing import Any

import psycopg
import trio

from bothy_notify.kernel.ephemeral import RecordingPublisher
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.store.events import append
from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, ev, make_config

MARKER = "test-marker"


def notifications(database_url: str, conn: psycopg.Connection[Any]) -> int:
    """Blocking: how many ``bothy_events`` notifications ``conn`` got up to and including
    an outbox append's (which notifies), counted once a marker notified after it came:
    notifications arrive in commit order, so every earlier one came before the marker."""
    with psycopg.connect(database_url) as producer:
        append(producer, [("user.upserted", {"user_id": "sam", "kind": "human", "active": True})])
        producer.commit()
        producer.execute("SELECT pg_notify('bothy_events', %s)", (MARKER,))
    for count, notification in enumerate(conn.notifies(timeout=10)):
        if notification.payload == MARKER:
            return count
    raise AssertionError("the marker notification never came")


async def test_an_append_wakes_the_round_held_here_without_notify(
    launch: Launch, database_url: str
) -> None:
    gateway = FakeGateway()
    publisher = gateway.publisher = RecordingPublisher()
    # A round that only a wake-up starts: its poll comes an hour later.
    node = await launch(
        gateway_factory=gateway_factory(gateway),
        config=make_config(notify={"poll_interval": "1h"}),
    )
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    gateway.presence.set("alex", PresenceEntry("desk", "macos", frozenset(), False))
    listener = await trio.to_thread.run_sync(lambda: psycopg.connect(database_url, autocommit=True))
    try:
        await trio.to_thread.run_sync(listener.execute, "LISTEN bothy_events")
        await node.append(
            ev("message.created", thread_id="t1", message_id="m1", thread_seq=1, author_id="sam")
        )
        with trio.fail_after(10):
            while not publisher.events:
                await trio.sleep(0.01)
        assert publisher.events[0].audience == "alex"
        # Only the outbox append notified.
        assert await trio.to_thread.run_sync(notifications, database_url, listener) == 1
    finally:
        listener.close()


async def test_the_api_of_a_node_without_a_round_appends_with_notify(
    launch: Launch, database_url: str
) -> None:
    node = await launch(config=make_config(server={"role": "api"}))
    listener = await trio.to_thread.run_sync(lambda: psycopg.connect(database_url, autocommit=True))
    try:
        await trio.to_thread.run_sync(listener.execute, "LISTEN bothy_events")
        await node.append(ev("user.upserted", user_id="alex", kind="human", active=True))
        # The API's append and the outbox append.
        assert await trio.to_thread.run_sync(notifications, database_url, listener) == 2
    finally:
        listener.close()
