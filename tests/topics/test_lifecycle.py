"""The recipient lifecycle of topic mode: a terminal answer deletes only while the
delivery config is the one the send used (PUSH-046), the expiry sweep (PUSH-024),
and nothing identifying in logs or metrics (PUSH-096)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
import trio

from bothy_notify.config import ConfigError, load_config_text
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.port import Message, Outcome, Target
from bothy_notify.topics.model import b64
from tests.harness import Launch, Node, make_config, wait_for
from tests.topics.helpers import (
    Recipient,
    add,
    call,
    conversation,
    envelope,
    hmac_key,
    register,
    subscribe,
    window,
)


class HeldProvider:
    """The fake provider with a gate: sends wait until the test opens it."""

    name = "fake"

    def __init__(self) -> None:
        self.inner = FakeProvider()
        self.gate = trio.Event()
        self.waiting = 0

    async def send(self, target: Target, message: Message) -> Outcome:
        self.waiting += 1
        await self.gate.wait()
        return await self.inner.send(target, message)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def exists(node: Node, who: Recipient) -> bool:
    rows = await node.sql(
        "SELECT 1 FROM bothy.topic_recipients WHERE recipient_id = %s", (who.recipient_id,)
    )
    return bool(rows)


async def test_a_dead_token_deletes_the_recipient_and_its_subscriptions(launch: Launch) -> None:
    node = await launch()
    who, topic = Recipient(), conversation()
    await register(node, who, token="dead-phone")
    await subscribe(node, who, [add(topic)])
    await node.append(envelope(topic))
    await node.settle()

    assert not await exists(node, who)
    assert await node.sql("SELECT count(*) FROM bothy.topic_subscriptions") == [(0,)]
    metrics = node.daemon.metrics
    assert metrics.topic_recipients.labels("dead")._value.get() == 1
    assert metrics.topic_deliveries.labels("fake", "dead")._value.get() == 1


@pytest.mark.parametrize(
    ("token", "outcome"), [("mismatch-x", "mismatch"), ("rejected-x", "rejected")]
)
async def test_mismatch_and_rejected_keep_the_recipient_after_one_attempt(
    launch: Launch, token: str, outcome: str
) -> None:
    node = await launch()
    who, topic = Recipient(), conversation()
    await register(node, who, token=token)
    await subscribe(node, who, [add(topic)])
    await node.append(envelope(topic))
    await node.settle()
    await node.advance(60)

    assert await exists(node, who)
    assert len(node.fake.sends) == 1
    assert node.daemon.metrics.topic_deliveries.labels("fake", outcome)._value.get() == 1


@pytest.mark.parametrize(
    ("second_token", "kept"),
    [("dead-new-phone", True), ("dead-phone", False)],
    ids=["config_changed_keeps", "same_config_deletes"],
)
async def test_a_terminal_answer_deletes_only_while_the_config_is_unchanged(
    launch: Launch, second_token: str, kept: bool
) -> None:
    held = HeldProvider()
    node = await launch(providers={"fake": held})
    who, topic = Recipient(), conversation()
    await register(node, who, token="dead-phone")
    await subscribe(node, who, [add(topic)])
    await node.append(envelope(topic))

    async def sending() -> bool:
        return held.waiting == 1

    await wait_for(sending, what="the send to reach the provider")
    # The app registers again while the provider still holds the first send.
    assert (await register(node, who, token=second_token)).status_code == 200
    held.gate.set()
    await node.settle()

    assert (held.inner.sends[0].token, held.inner.sends[0].outcome) == ("dead-phone", "dead")
    assert await exists(node, who) is kept
    dead = node.daemon.metrics.topic_recipients.labels("dead")._value.get()
    assert dead == (0 if kept else 1)


async def test_the_sweep_deletes_recipients_not_renewed_within_the_ttl(launch: Launch) -> None:
    node = await launch(config=make_config(push={"fake": {}, "recipient_ttl": "1d"}))
    idle, renewing = Recipient(), Recipient()
    for who in (idle, renewing):
        await register(node, who)
        await subscribe(node, who, [add(conversation())])
    node.clock.advance(timedelta(hours=20))
    await subscribe(node, renewing, [])  # an update renews
    node.clock.advance(timedelta(hours=5))
    assert node.daemon.housekeeper is not None

    result = await node.daemon.housekeeper.sweep_now()

    assert result.recipients_expired == 1
    assert not await exists(node, idle) and await exists(node, renewing)
    assert await node.sql("SELECT count(*) FROM bothy.topic_subscriptions") == [(1,)]
    assert node.daemon.metrics.topic_recipients.labels("expired")._value.get() == 1
    assert (await subscribe(node, idle, [])).status_code == 404


def test_a_recipient_ttl_under_one_day_is_refused() -> None:
    with pytest.raises(ConfigError) as ttl:
        load_config_text('[push]\nrecipient_ttl = "23h"', env={})
    assert "push.recipient_ttl: must be at least 1d" in str(ttl.value)
    with pytest.raises(ConfigError) as limit:
        load_config_text("[limits]\nmax_push_topics = 0", env={})
    assert "limits.max_push_topics: must be at least 1" in str(limit.value)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    caught: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("bothy")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield caught
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


async def test_no_log_line_or_metric_names_an_id_secret_token_topic_or_key(
    launch: Launch, records: list[logging.LogRecord]
) -> None:
    node = await launch()
    people = [Recipient() for _ in range(4)]
    topic, key = conversation(), hmac_key()
    tokens = ["dead-aa11", "mismatch-bb22", "rejected-cc33", "transient-dd44"]
    w = window(key)
    for who, token in zip(people, tokens, strict=True):
        await register(node, who, token=token)
        await subscribe(node, who, [add(topic, keys=w["keys"], base=w["base"])])
    await node.append(envelope(topic), envelope(topic, sender_key=key))
    await node.settle()
    await node.advance(120)
    await call(node, "unregister", people[1].identity())

    secrets: list[str] = [b64(topic), topic.hex(), b64(key), *tokens]
    for who in people:
        secrets += [b64(who.recipient_id), who.recipient_id.hex(), b64(who.secret)]
    text = "\n".join(
        f"{r.getMessage()} {sorted((k, str(v)) for k, v in r.__dict__.items())}" for r in records
    )
    text += node.daemon.metrics.render().decode()
    assert not [s for s in secrets if s in text]
