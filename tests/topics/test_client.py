"""The reference client against a real daemon over HTTP: enable, disable and state,
overrides and rules, key windows, the renewal deadline, repair passes that
converge in ceil(topics / 1000) runs, NOT_FOUND, and the error classes
(PUSH-080 to 089, 092)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from bothy_notify.client import (
    Consent,
    Conversation,
    ConversationKind,
    Delivery,
    HttpRecipientApi,
    Identity,
    LocalStore,
    MemoryConversations,
    NotificationClient,
    Override,
    RecipientState,
    Rules,
    RunnerDisabled,
    Status,
    Subscription,
)
from bothy_notify.topics.model import epoch_of
from tests.harness import Launch, Node, make_config, wait_for
from tests.topics.helpers import DEVICE, Recipient, add, conversation, subscribe, welcome_topic

FAKE = Delivery("fake", token="tok-client")


@dataclass
class CountingApi:
    """The real HTTP api, with a record of the calls made (the one-request-per-run rule)."""

    inner: HttpRecipientApi
    calls: list[str] = field(default_factory=list)

    async def register(self, identity: Identity, delivery: Delivery) -> RecipientState:
        self.calls.append("register")
        return await self.inner.register(identity, delivery)

    async def unregister(self, identity: Identity) -> None:
        self.calls.append("unregister")
        await self.inner.unregister(identity)

    async def update_subscriptions(
        self, identity: Identity, adds: Sequence[Subscription], removes: Sequence[bytes]
    ) -> RecipientState:
        self.calls.append("subscriptions")
        return await self.inner.update_subscriptions(identity, adds, removes)


@dataclass
class World:
    node: Node
    source: MemoryConversations
    api: CountingApi
    path: Path
    clients: list[NotificationClient] = field(default_factory=list)

    def client(self, *, runner_enabled: bool = True) -> NotificationClient:
        """A client on the world's SQLite file (a second call is a restarted process)."""
        made = NotificationClient(
            store=LocalStore(self.path),
            api=self.api,
            source=self.source,
            clock=self.node.clock,
            runner_enabled=runner_enabled,
        )
        self.clients.append(made)
        return made

    def groups(self, n: int, **kw: Any) -> list[bytes]:
        topics = [conversation() for _ in range(n)]
        for t in topics:
            self.source.add(Conversation(t, **kw))
        return topics

    async def backend_topics(self, client: NotificationClient) -> set[bytes]:
        identity = client.identity()
        assert identity is not None
        rows = await self.node.sql(
            "SELECT topic FROM bothy.topic_subscriptions WHERE recipient_id = %s",
            (identity.recipient_id,),
        )
        return {bytes(r[0]) for r in rows}


async def open_world(launch: Launch, tmp_path: Path, **sections: Any) -> AsyncIterator[World]:
    node = await launch(config=make_config(**sections)) if sections else await launch()
    http = HttpRecipientApi(node.api, DEVICE)
    world = World(node, MemoryConversations(welcome_topic()), CountingApi(http), tmp_path / "c.db")
    try:
        yield world
    finally:
        await http.aclose()


@pytest.fixture
async def world(launch: Launch, tmp_path: Path) -> AsyncIterator[World]:
    async for w in open_world(launch, tmp_path):
        yield w


async def runs(client: NotificationClient, n: int) -> list[str | None]:
    return [(await client.sync_once()).call for _ in range(n)]


# ---------------------------------------------------------------- enable, disable, state


async def test_enable_creates_the_identity_and_registers_inline(world: World) -> None:
    client = world.client()
    assert client.state().status is Status.DISABLED and client.identity() is None

    state = await client.enable(FAKE)

    assert state.status is Status.ENABLED
    assert state.recipient is not None and state.recipient.channel == "fake"
    assert world.api.calls == ["register"]
    identity = client.identity()
    assert identity is not None
    assert await world.node.sql(
        "SELECT delivery FROM bothy.topic_recipients WHERE recipient_id = %s",
        (identity.recipient_id,),
    ) == [("tok-client",)]


async def test_enable_without_a_task_runner_is_refused_and_stores_nothing(world: World) -> None:
    client = world.client(runner_enabled=False)
    with pytest.raises(RunnerDisabled):
        await client.enable(FAKE)
    assert client.identity() is None and client.state().status is Status.DISABLED
    assert world.api.calls == []


async def test_disable_then_enable_keeps_the_id_secret_and_overrides(world: World) -> None:
    client = world.client()
    (topic,) = world.groups(1)
    await client.enable(FAKE)
    client.set_conversation(topic, Override.DISABLED)
    first = client.identity()
    await runs(client, 1)

    await client.disable()
    assert client.state().status is Status.DISABLED
    assert not await world.node.sql("SELECT 1 FROM bothy.topic_recipients")
    assert await runs(client, 2) == [None, None]  # no call while disabled

    await client.enable(Delivery("fake", token="tok-new-phone"))
    assert client.identity() == first
    assert not client.conversation_enabled(world.source.items[topic])
    await runs(client, 1)
    assert await world.backend_topics(client) == {world.source.welcome}


async def test_unregister_of_an_unknown_recipient_counts_as_success(world: World) -> None:
    client = world.client()
    await client.enable(FAKE)
    await world.node.sql("DELETE FROM bothy.topic_recipients")
    await client.disable()
    assert client.state().status is Status.DISABLED and world.api.calls[-1] == "unregister"


# ---------------------------------------------------------------- what is desired


async def test_rules_and_overrides_decide_the_subscribed_topics(world: World) -> None:
    s = world.source
    allowed, denied_on, allowed_off, unknown, sync, gone = (conversation() for _ in range(6))
    s.add(Conversation(allowed))
    s.add(Conversation(denied_on, ConversationKind.DM, Consent.DENIED))
    s.add(Conversation(allowed_off, ConversationKind.DM))
    s.add(Conversation(unknown, consent=Consent.UNKNOWN))
    s.add(Conversation(sync, ConversationKind.SYNC))
    s.add(Conversation(gone, active=False))
    client = world.client()
    client.set_conversation(denied_on, Override.ENABLED)
    client.set_conversation(allowed_off, Override.DISABLED)
    await client.enable(FAKE, Rules(include_commits=True))

    assert await runs(client, 2) == ["subscriptions", None]

    assert await world.backend_topics(client) == {allowed, denied_on, s.welcome}
    flags = await world.node.sql("SELECT topic, include_commits FROM bothy.topic_subscriptions")
    assert {bytes(t): f for t, f in flags} == {allowed: True, denied_on: True, s.welcome: False}
    assert client.conversation_enabled(s.items[denied_on])
    assert not client.conversation_enabled(s.items[allowed_off])

    # A rule change (sync groups, no welcomes, no commits) is sent by the next run.
    await client.enable(FAKE, Rules(include_welcomes=False, include_sync_groups=True))
    await runs(client, 1)
    assert await world.backend_topics(client) == {allowed, denied_on, sync}
    flags = await world.node.sql("SELECT bool_or(include_commits) FROM bothy.topic_subscriptions")
    assert flags == [(False,)]


async def test_key_windows_cover_the_next_epoch_and_follow_the_root_key(world: World) -> None:
    (topic,) = world.groups(1)
    client = world.client()

    def give_keys(first: int, last: int) -> None:
        for e in range(first, last + 1):
            world.source.keys[(topic, e)] = os.urandom(42)

    current = epoch_of(world.node.clock.now())
    give_keys(current - 1, current + 1)
    await client.enable(FAKE, Rules(include_welcomes=False))
    await runs(client, 1)

    async def window() -> tuple[Any, ...]:
        rows = await world.node.sql(
            "SELECT hmac_epoch_base, hmac_pads_2 IS NOT NULL FROM bothy.topic_subscriptions"
        )
        return rows[0]

    assert await window() == (current - 1, True)
    assert await runs(client, 1) == [None]  # the window is current: nothing to send

    world.source.root = "root-2"  # a root key cycle re-uploads
    assert await runs(client, 1) == ["subscriptions"]

    world.node.clock.advance(timedelta(days=30))  # the window no longer reaches current + 1
    give_keys(current + 2, current + 2)
    assert await runs(client, 1) == ["register"]  # the renewal deadline passed too
    assert await runs(client, 2) == ["subscriptions", None]
    assert await window() == (current, True)


# ---------------------------------------------------------------- renewal


async def test_renewal_runs_at_a_quarter_of_the_remaining_time(world: World) -> None:
    client = world.client()
    await client.enable(FAKE, Rules(include_welcomes=False))
    assert await runs(client, 1) == [None]  # empty diff, deadline ahead: no call

    world.node.clock.advance(timedelta(days=7.5) - timedelta(seconds=1))
    assert await runs(client, 1) == [None]
    world.node.clock.advance(timedelta(seconds=1))
    assert await runs(client, 2) == ["register", None]


# ---------------------------------------------------------------- convergence and repair


async def test_2500_topics_are_subscribed_in_three_runs_while_the_count_never_matches(
    world: World,
) -> None:
    client = world.client()
    await client.enable(FAKE, Rules(include_welcomes=False))
    identity = client.identity()
    assert identity is not None
    # The daemon holds seven topics this client has no record of.
    ghost = Recipient(identity.recipient_id, identity.secret)
    await subscribe(world.node, ghost, [add(conversation()) for _ in range(7)])
    desired = set(world.groups(2500))

    assert await runs(client, 3) == ["subscriptions"] * 3
    assert desired <= await world.backend_topics(client)

    # The first answer (1007 against 1000) started one repair pass: the 1000 rows it
    # marked are re-sent after the new topics, then it ends; the count stays high
    # (topics this client never recorded), which is logged once and left alone.
    assert await runs(client, 3) == ["subscriptions", None, None]
    assert client.repair_passes == 1
    state = client.state().recipient
    assert state is not None and state.topic_count == 2507


async def test_a_repair_pass_converges_and_resumes_after_a_restart(world: World) -> None:
    client = world.client()
    await client.enable(FAKE, Rules(include_welcomes=False))
    desired = set(world.groups(2500))
    assert await runs(client, 3) == ["subscriptions"] * 3
    identity = client.identity()
    assert identity is not None
    # The daemon loses every subscription (a restore); the renewal sees a count of 0.
    await world.node.sql(
        "DELETE FROM bothy.topic_subscriptions; UPDATE bothy.topic_recipients SET topic_count = 0"
    )
    world.node.clock.advance(timedelta(days=8))
    assert await runs(client, 2) == ["register", "subscriptions"]
    assert client.repair_passes == 1

    restarted = world.client()  # a new process on the same file
    assert await runs(restarted, 3) == ["subscriptions", "subscriptions", None]
    assert restarted.repair_passes == 0  # the pass resumed; it did not start again
    assert await world.backend_topics(restarted) == desired


async def test_not_found_clears_the_uploaded_set_registers_again_and_repairs(
    world: World,
) -> None:
    client = world.client()
    first = world.groups(3)
    await client.enable(FAKE)
    await runs(client, 1)
    await world.node.sql("DELETE FROM bothy.topic_recipients")  # a backend restore
    later = world.groups(1)
    client.wake()

    assert await runs(client, 3) == ["subscriptions", "register", "subscriptions"]
    assert await world.backend_topics(client) == {*first, *later, world.source.welcome}
    assert await runs(client, 1) == [None]


# ---------------------------------------------------------------- error classes


async def test_a_terminal_answer_sets_failed_and_stops_the_tasks(world: World) -> None:
    client = world.client()
    state = await client.enable(Delivery("webhook", url="https://hooks.example/h"))

    assert state.status is Status.FAILED and state.error_code == "failed_precondition"
    assert client.state() == state
    assert await runs(client, 2) == [None, None]
    assert world.api.calls == ["register"]


async def test_a_topic_limit_drops_the_adds_until_the_desired_set_changes(
    launch: Launch, tmp_path: Path
) -> None:
    async for w in open_world(launch, tmp_path, limits={"max_push_topics": 5}):
        client = w.client()
        w.groups(8)
        await client.enable(FAKE, Rules(include_welcomes=False))
        assert await runs(client, 2) == ["subscriptions", None]
        assert client.state().status is Status.ENABLED

        for topic in list(w.source.items)[:4]:
            client.set_conversation(topic, Override.DISABLED)
        assert await runs(client, 2) == ["subscriptions", None]
        assert len(await w.backend_topics(client)) == 4


async def test_other_errors_back_off_from_60_seconds(launch: Launch, tmp_path: Path) -> None:
    node = await launch()
    with trio.socket.socket() as probe:  # a port where nothing listens
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = HttpRecipientApi(f"http://127.0.0.1:{port}", DEVICE)
    api = CountingApi(http)
    client = NotificationClient(
        store=LocalStore(tmp_path / "c.db"),
        api=api,
        source=MemoryConversations(welcome_topic()),
        clock=node.clock,
    )
    state = await client.enable(FAKE)
    assert state.status is Status.ENABLED  # retried by the task

    assert await runs(client, 1) == [None]
    node.clock.advance(60)
    assert await runs(client, 1) == ["register"]
    node.clock.advance(60)
    assert await runs(client, 1) == [None]  # the backoff doubled
    node.clock.advance(60)
    assert await runs(client, 1) == ["register"]
    assert api.calls == ["register"] * 3
    await http.aclose()


# ---------------------------------------------------------------- the task runner


async def test_the_task_runner_syncs_after_a_wake(world: World, nursery: trio.Nursery) -> None:
    client = world.client()
    await client.enable(FAKE, Rules(include_welcomes=False))
    await nursery.start(client.run)
    (topic,) = world.groups(1)
    client.wake()

    async def subscribed() -> bool:
        return topic in await world.backend_topics(client)

    await wait_for(subscribed, what="the runner to subscribe the new conversation")
    nursery.cancel_scope.cancel()


async def test_a_restarted_runner_sends_a_change_whose_wake_was_lost(
    world: World, nursery: trio.Nursery
) -> None:
    client = world.client()
    await client.enable(FAKE, Rules(include_welcomes=False))
    assert await runs(client, 1) == [None]  # nothing desired yet; the hourly run is ahead
    # The app commits a new conversation, and its process ends before it calls wake().
    (topic,) = world.groups(1)
    before = len(world.api.calls)

    restarted = world.client()
    await nursery.start(restarted.run)

    async def subscribed() -> bool:
        return topic in await world.backend_topics(restarted)

    # No clock advance: the run at start sends it, not the hourly one.
    await wait_for(subscribed, what="the run at start to subscribe the conversation")
    assert world.api.calls[before:] == ["subscriptions"]
    nursery.cancel_scope.cancel()


async def test_a_topic_limit_holds_back_only_that_runs_adds(launch: Launch, tmp_path: Path) -> None:
    async for w in open_world(launch, tmp_path, limits={"max_push_topics": 5}):
        current = epoch_of(w.node.clock.now())

        def keyed(world: World, n: int, now: int = current) -> list[bytes]:
            topics = world.groups(n)
            for t in topics:
                for e in range(now - 1, now + 3):
                    world.source.keys[(t, e)] = os.urandom(42)
            return topics

        first = keyed(w, 3)
        client = w.client()
        await client.enable(FAKE, Rules(include_welcomes=False))
        assert await runs(client, 1) == ["subscriptions"]
        later = keyed(w, 3)  # six desired, five allowed: this run's three adds are refused
        assert await runs(client, 2) == ["subscriptions", None]
        assert await w.backend_topics(client) == set(first)

        # An epoch later the uploaded topics' windows are re-sent (the refused ones
        # still wait), and a restart keeps them held back.
        w.node.clock.advance(timedelta(days=30))
        restarted = w.client()
        assert await runs(restarted, 3) == ["register", "subscriptions", None]
        bases = await w.node.sql("SELECT DISTINCT hmac_epoch_base FROM bothy.topic_subscriptions")
        assert bases == [(current,)]
        assert await w.backend_topics(restarted) == set(first)

        # The desired set changes (a conversation is left): the held-back adds go again.
        w.source.add(Conversation(first[0], active=False))
        assert await runs(restarted, 2) == ["subscriptions", None]
        assert await w.backend_topics(restarted) == {*first[1:], *later}
