"""Topic mode in the consumer round: envelopes appended over HTTP, decided against
subscriptions, and sent through the fake provider (PUSH-025, 041 to 044, 052)."""

from __future__ import annotations

import json
import os
from typing import Any

from bothy_notify.kernel.clock import to_unix_micros
from bothy_notify.kernel.ids import is_valid_id
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.store import events as eventlog
from bothy_notify.store.jobs import JobSpec
from bothy_notify.store.jobs import insert as insert_jobs
from bothy_notify.store.topics import TOPIC_PUSH_SEND
from bothy_notify.topics.model import b64, hmac_pads
from bothy_notify.topics.send import TopicSendArgs
from tests.harness import Launch, Node, make_config, wait_for
from tests.topics.helpers import (
    Recipient,
    add,
    conversation,
    envelope,
    hmac_key,
    register,
    subscribe,
    topic_sends,
    welcome_topic,
    window,
)


async def subscribed(
    node: Node, topic: bytes, *, key: bytes | None = None, include_commits: bool = False
) -> Recipient:
    """A new recipient subscribed to ``topic`` (with a key window holding ``key``)."""
    who = Recipient()
    assert (await register(node, who, token=f"tok-{who.recipient_id.hex()[:8]}")).status_code == 200
    entry = add(topic, include_commits=include_commits)
    if key is not None:
        w = window(key)
        entry = add(topic, keys=w["keys"], base=w["base"], include_commits=include_commits)
    assert (await subscribe(node, who, [entry])).status_code == 200
    return who


def pushed(node: Node, who: Recipient) -> list[str]:
    """The sequence ids pushed to ``who``, in sequence order (sends run concurrently)."""
    sent = [s["sequence_id"] for s in topic_sends(node) if s["to"] == who.recipient_id.hex()]
    return sorted(sent, key=int)


def suppressed(node: Node, channel: str = "fake") -> float:
    return float(node.daemon.metrics.topic_deliveries.labels(channel, "suppressed")._value.get())


async def test_a_push_carries_only_the_topic_and_the_sequence_id(launch: Launch) -> None:
    node = await launch()
    topic = conversation()
    who = await subscribed(node, topic)
    (seq,) = await node.append(envelope(topic, data=b"secret words"))
    await node.settle()

    (send,) = [s for s in node.fake.sends if s.registration_id == who.recipient_id.hex()]
    assert send.payload == {"topic": b64(topic), "sequence_id": str(seq)}
    assert send.outcome == "delivered"
    delivered = node.daemon.metrics.topic_deliveries.labels("fake", "delivered")._value.get()
    assert delivered == 1


async def test_eligibility_follows_the_kind_and_should_push(launch: Launch) -> None:
    node = await launch()
    topic, welcome = conversation(), welcome_topic()
    who = await subscribed(node, topic, include_commits=True)
    assert (await subscribe(node, who, [add(welcome)])).status_code == 200
    seqs = await node.append(
        envelope(topic, kind="application", should_push=False),
        envelope(topic, kind="application", should_push=True),
        envelope(welcome, kind="welcome", should_push=False),
        envelope(topic, kind="commit", should_push=False),
        envelope(topic, kind="proposal", should_push=False),
    )
    await node.settle()

    assert pushed(node, who) == [str(s) for s in seqs[1:]]


async def test_a_commit_reaches_only_the_opted_in_subscription_and_a_message_both(
    launch: Launch,
) -> None:
    node = await launch()
    topic = conversation()
    opted_in = await subscribed(node, topic, include_commits=True)
    default = await subscribed(node, topic)
    commit, message = await node.append(
        envelope(topic, kind="commit", should_push=False), envelope(topic)
    )
    await node.settle()

    assert pushed(node, opted_in) == [str(commit), str(message)]
    assert pushed(node, default) == [str(message)]


async def test_every_envelope_is_one_push_per_subscription_without_coalescing(
    launch: Launch,
) -> None:
    node = await launch()
    topic = conversation()
    a, b = await subscribed(node, topic), await subscribed(node, topic)
    seqs = await node.append(envelope(topic), envelope(topic), envelope(topic))
    await node.settle()

    assert pushed(node, a) == pushed(node, b) == [str(s) for s in seqs]


async def test_the_senders_own_message_is_suppressed_and_anothers_in_the_batch_is_sent(
    launch: Launch,
) -> None:
    node = await launch()
    topic = conversation()
    mine, theirs = hmac_key(), hmac_key()
    me = await subscribed(node, topic, key=mine)
    other = await subscribed(node, topic, key=theirs)
    own, foreign = await node.append(
        envelope(topic, sender_key=mine), envelope(topic, sender_key=theirs)
    )
    await node.settle()

    assert pushed(node, me) == [str(foreign)]
    assert pushed(node, other) == [str(own)]
    assert suppressed(node) == 2


async def test_a_key_window_that_does_not_cover_the_epoch_sends(launch: Launch) -> None:
    node = await launch()
    topic = conversation()
    key = hmac_key()
    who = Recipient()
    await register(node, who)
    stale = window(key, offset=-4)  # epochs current-4 .. current-2
    await subscribe(node, who, [add(topic, keys=stale["keys"], base=stale["base"])])
    (seq,) = await node.append(envelope(topic, sender_key=key))
    await node.settle()

    assert pushed(node, who) == [str(seq)]
    assert suppressed(node) == 0


async def test_an_envelope_without_sender_hmac_or_a_wrong_one_sends(launch: Launch) -> None:
    node = await launch()
    topic = conversation()
    key = hmac_key()
    who = await subscribed(node, topic, key=key)
    wrong = envelope(topic, sender_key=key)
    wrong["payload"]["sender_hmac"] = b64(os.urandom(32))
    seqs = await node.append(envelope(topic), wrong)
    await node.settle()

    assert pushed(node, who) == [str(s) for s in seqs]


async def test_an_envelope_settled_before_the_subscription_is_never_pushed(
    launch: Launch,
) -> None:
    # No round runs on an api node: the envelopes wait in the log while the
    # subscription is stored, and are decided late, by a worker started afterwards.
    api = await launch(config=make_config(server={"role": "api"}))
    topic = conversation()
    who = Recipient()
    await register(api, who)
    (before,) = await api.append(envelope(topic))
    assert (await subscribe(api, who, [add(topic)])).status_code == 200
    (after,) = await api.append(envelope(topic))
    # Adding the topic again keeps its start position.
    assert (await subscribe(api, who, [add(topic, include_commits=True)])).status_code == 200

    worker = await launch(config=make_config(server={"role": "worker"}))
    await worker.settle()

    assert pushed(worker, who) == [str(after)]
    assert before < after


async def test_an_envelope_with_no_subscriber_never_reaches_the_round(launch: Launch) -> None:
    outcomes: list[RoundOutcome] = []
    node = await launch(before_commit=outcomes.append)
    topic = conversation()
    await subscribed(node, conversation())  # someone, on another topic
    await node.append(envelope(topic, data=b"x" * 1000))
    await node.settle()

    assert sum(o.topics.envelopes for o in outcomes) == 1
    assert sum(o.topics.deliveries for o in outcomes) == 0
    assert await node.jobs("topics.push_send") == []


def test_the_round_reads_no_envelope_payload(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url) as conn:
        eventlog.append(conn, [("envelope.published", envelope(conversation())["payload"])])
        conn.commit()
        with conn.transaction():
            _cursor, (event,) = eventlog.lock_and_read(conn, 10)
    assert event.type == "envelope.published" and event.payload == {}


async def test_ten_thousand_subscribers_of_one_topic_are_decided_in_bounded_pages(
    launch: Launch,
) -> None:
    outcomes: list[RoundOutcome] = []
    node = await launch(before_commit=outcomes.append)
    topic = conversation()
    key = hmac_key()
    base = window(key)["base"]
    # Subscribers are written straight to the tables: 10,000 HTTP calls would test
    # nothing more. Every tenth holds the sender's key.
    await node.sql(
        "INSERT INTO bothy.topic_recipients (recipient_id, secret_hash, channel, delivery,"
        " topic_count, created_at, renewed_at)"
        " SELECT sha256(int8send(i)), sha256(int8send(-i)), 'fake', 'tok', 1, now(), now()"
        " FROM generate_series(1, 10000) AS i"
    )
    pads = hmac_pads(key)
    await node.sql(
        "INSERT INTO bothy.topic_subscriptions (recipient_id, topic, since_xid, include_commits,"
        " hmac_epoch_base, hmac_pads_0, hmac_pads_1, hmac_pads_2)"
        " SELECT sha256(int8send(i)), %s, '1', false,"
        " CASE WHEN i %% 10 = 0 THEN %s END, CASE WHEN i %% 10 = 0 THEN %s END,"
        " CASE WHEN i %% 10 = 0 THEN %s END, CASE WHEN i %% 10 = 0 THEN %s END"
        " FROM generate_series(1, 10000) AS i",
        (topic, base, pads, pads, pads),
    )
    await node.append(envelope(topic, sender_key=key))

    async def committed() -> bool:
        rows = await node.sql("SELECT count(*) FROM bothy.jobs WHERE kind = 'topics.push_send'")
        return bool(rows[0][0])

    await wait_for(committed, timeout=30, what="the round to commit the envelope's jobs")
    topics = [o.topics for o in outcomes if o.topics.envelopes]
    (result,) = topics
    assert result.deliveries == 10_000
    assert result.largest_page == 1000 and result.pages == 11  # ten full pages, one empty
    assert result.jobs == 9000 and result.suppressed == {"fake": 1000}
    rows = await node.sql(
        "SELECT count(*), count(DISTINCT args->>'recipient_id') FROM bothy.jobs"
        " WHERE kind = 'topics.push_send'"
    )
    assert rows == [(9000, 9000)]


async def test_every_topic_job_arg_is_an_id_or_an_integer(launch: Launch) -> None:
    node = await launch()
    topic, welcome = conversation(), welcome_topic()
    who = await subscribed(node, topic, include_commits=True)
    await subscribe(node, who, [add(welcome)])
    await node.append(
        envelope(topic), envelope(welcome, kind="welcome"), envelope(topic, kind="commit")
    )
    await node.settle()

    jobs = await node.jobs("topics.push_send")
    assert len(jobs) == 3
    seen: dict[str, set[Any]] = {}
    for job in jobs:
        for key, value in job["args"].items():
            assert is_valid_id(key)
            assert type(value) is int or is_valid_id(value), key
            seen.setdefault(key, set()).add(value)
    # The binary IDs travel as hex: the walk above saw them, not something else.
    assert seen["recipient_id"] == {who.recipient_id.hex()}
    assert seen["topic"] == {topic.hex(), welcome.hex()}


async def test_a_job_whose_recipient_is_gone_is_skipped(launch: Launch) -> None:
    node = await launch()
    now = node.clock.now()
    args = TopicSendArgs(
        1, os.urandom(32), conversation(), to_unix_micros(now), to_unix_micros(now)
    )
    spec = JobSpec(TOPIC_PUSH_SEND, args.to_args(), now, 3)
    await node.db.run(lambda c: insert_jobs(c, [spec], now))
    await node.settle()

    (job,) = await node.jobs("topics.push_send")
    assert job["state"] == "completed"
    finished = node.daemon.metrics.jobs_finished.labels(TOPIC_PUSH_SEND, "skipped_no_recipient")
    assert finished._value.get() == 1
    assert topic_sends(node) == []


async def test_malformed_envelope_rows_written_around_the_function_do_not_stop_the_round(
    launch: Launch,
) -> None:
    node = await launch()
    topic = conversation()
    key = hmac_key()
    who = await subscribed(node, topic, key=key)
    signed = envelope(topic, sender_key=key)["payload"]
    bad = [
        ["not", "an", "object"],
        {**signed, "topic": "%%%"},
        {**signed, "should_push": "yes"},
        {**signed, "kind": "reaction"},
        {**signed, "data": "not base64!"},  # the sender check cannot run: sent (fail open)
    ]
    for payload in bad:
        await node.sql(
            "INSERT INTO bothy.events (type, payload) VALUES ('envelope.published', %s::jsonb)",
            (json.dumps(payload),),
        )
    (good,) = await node.append(envelope(topic))
    await node.settle()

    rows = await node.sql("SELECT max(seq) FROM bothy.events")
    assert pushed(node, who) == [str(rows[0][0] - 1), str(good)]
