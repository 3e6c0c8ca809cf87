"""Topic mode's HTTP API over real HTTP on a running daemon: registration and
ownership (PUSH-001 to 007), subscriptions (PUSH-020 to 026), the order of the
checks, and "a refused request changes nothing"."""

from __future__ import annotations

import base64
import hashlib
from datetime import timedelta
from typing import Any

import httpx
import pytest

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webhook import WebhookProvider
from bothy_notify.topics.model import b64, epoch_of
from tests.harness import Launch, Node, device_token, make_config, producer_token
from tests.support.offline import offline_app
from tests.topics.helpers import (
    DEVICE,
    Recipient,
    add,
    call,
    conversation,
    hmac_key,
    register,
    subscribe,
    welcome_topic,
)

HOOK_HOST = "hooks.example.test"
PUBLIC = "93.184.216.34"
KEY_32 = base64.b64encode(b"k" * 32).decode()


def error(response: Any) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["message"]


async def recipient_row(node: Node, who: Recipient) -> dict[str, Any] | None:
    rows = await node.sql(
        "SELECT secret_hash, channel, delivery, environment, signing_key, topic_count,"
        " renewed_at FROM bothy.topic_recipients WHERE recipient_id = %s",
        (who.recipient_id,),
    )
    if not rows:
        return None
    keys = ("secret_hash", "channel", "delivery", "environment", "signing_key", "topic_count")
    row = dict(zip(keys, rows[0][:6], strict=True))
    row["renewed_at"] = rows[0][6]
    return row


async def subscriptions(node: Node, who: Recipient) -> dict[bytes, tuple[Any, ...]]:
    rows = await node.sql(
        "SELECT topic, since_xid::text, include_commits, hmac_epoch_base,"
        " hmac_pads_0 IS NOT NULL, hmac_pads_1 IS NOT NULL, hmac_pads_2 IS NOT NULL"
        " FROM bothy.topic_subscriptions WHERE recipient_id = %s",
        (who.recipient_id,),
    )
    return {bytes(r[0]): tuple(r[1:]) for r in rows}


async def snapshot(node: Node) -> list[Any]:
    """Everything topic mode stores, to prove a refusal changed nothing."""
    recipients = await node.sql(
        "SELECT recipient_id, secret_hash, channel, delivery, environment, signing_key,"
        " topic_count, renewed_at FROM bothy.topic_recipients ORDER BY recipient_id"
    )
    subs = await node.sql(
        "SELECT recipient_id, topic, since_xid::text, include_commits, hmac_epoch_base,"
        " hmac_pads_0, hmac_pads_1, hmac_pads_2 FROM bothy.topic_subscriptions"
        " ORDER BY recipient_id, topic"
    )
    return [recipients, subs]


async def hooked(launch: Launch, **sections: Any) -> Node:
    """A node with the fake channel and a webhook channel for hooks.example.test."""
    node = await launch(
        config=make_config(**sections),
        providers={
            "fake": FakeProvider(),
            "webhook": WebhookProvider(
                allowed_domains=(HOOK_HOST,),
                resolver=FakeResolver({HOOK_HOST: [PUBLIC], "private.example.test": ["10.0.0.1"]}),
                clock=FakeClock(),
            ),
        },
    )
    return node


# ---------------------------------------------------------------- registration


async def test_register_stores_the_secret_hash_the_clock_and_zero_topics(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    response = await register(node, who, token="tok-ok")

    assert response.status_code == 200
    expires = node.clock.now() + timedelta(days=30)
    assert response.json() == {
        "topic_count": 0,
        "channel": "fake",
        "expires_at": expires.isoformat().replace("+00:00", "Z"),
    }
    row = await recipient_row(node, who)
    assert row is not None
    assert bytes(row["secret_hash"]) == hashlib.sha256(who.secret).digest()
    assert row["renewed_at"] == node.clock.now()
    assert (row["channel"], row["delivery"], row["topic_count"]) == ("fake", "tok-ok", 0)
    assert node.daemon.metrics.topic_recipients.labels("registered")._value.get() == 1


async def test_a_producer_token_opens_the_endpoints_too(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    body = {**who.identity(), "channel": "fake", "token": "tok-ok"}
    response = await call(node, "register", body, token=producer_token())
    assert response.status_code == 200


async def test_no_token_or_a_producer_token_without_scope_is_refused(launch: Launch) -> None:
    node = await launch()
    body = {**Recipient().identity(), "channel": "fake", "token": "tok-ok"}
    missing = await node.request("POST", "/v1/recipients/register", json=body)
    assert missing.status_code == 401
    unscoped = await call(node, "register", body, token=producer_token(scope="other"))
    assert error(unscoped)[:2] == (403, "forbidden")
    assert await snapshot(node) == [[], []]


async def test_register_again_replaces_the_config_renews_and_keeps_subscriptions(
    launch: Launch,
) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who, token="tok-first")
    topic = conversation()
    key = hmac_key()
    base = epoch_of(node.clock.now()) - 1
    await subscribe(node, who, [add(topic, keys=[key], base=base, include_commits=True)])
    before = await subscriptions(node, who)
    node.clock.advance(3600)

    response = await register(node, who, token="tok-second")

    assert response.status_code == 200
    assert response.json()["topic_count"] == 1
    row = await recipient_row(node, who)
    assert row is not None
    assert row["delivery"] == "tok-second" and row["renewed_at"] == node.clock.now()
    assert await subscriptions(node, who) == before
    assert node.daemon.metrics.topic_recipients.labels("registered")._value.get() == 1


async def test_a_wrong_secret_is_refused_everywhere_and_changes_nothing(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who, token="tok-ok")
    await subscribe(node, who, [add(conversation())])
    before = await snapshot(node)
    thief = Recipient(recipient_id=who.recipient_id)
    node.clock.advance(60)

    for response in (
        await register(node, thief, token="tok-thief"),
        await subscribe(node, thief, [add(conversation())]),
        await call(node, "unregister", thief.identity()),
    ):
        assert error(response) == (403, "permission_denied", "recipient secret is not valid")
    assert await snapshot(node) == before


async def test_the_stored_hash_is_not_accepted_as_a_secret(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    row = await recipient_row(node, who)
    assert row is not None
    stolen = Recipient(recipient_id=who.recipient_id, secret=bytes(row["secret_hash"]))
    assert (await subscribe(node, stolen, [])).status_code == 403
    assert not await node.sql(
        "SELECT 1 FROM bothy.topic_recipients WHERE secret_hash = %s", (who.secret,)
    )


async def test_a_channel_without_its_block_is_a_failed_precondition(launch: Launch) -> None:
    node = await launch()  # [push.fake] only
    apns = await register(node, Recipient(), channel="apns", token="ab" * 32)
    hook = await register(
        node, Recipient(), channel="webhook", url="https://hooks.example.test/h", signing_key=KEY_32
    )
    for response in (apns, hook):
        assert error(response) == (409, "failed_precondition", "channel is not configured")
    assert await snapshot(node) == [[], []]


async def test_a_channel_whose_block_has_apps_is_a_failed_precondition(launch: Launch) -> None:
    # A recipient carries no app_id, so no app of the block can be chosen for it.
    node = await launch(
        providers={"apns": {"com.example.a": FakeProvider()}, "fake": FakeProvider()}
    )
    apns = await register(node, Recipient(), channel="apns", token="ab" * 32)
    webpush = await register(node, Recipient(), channel="webpush", token="x")
    assert error(apns) == (409, "failed_precondition", "channel is not configured")
    assert error(webpush) == (400, "invalid_argument", "request is malformed")  # no channel
    assert (await register(node, Recipient())).status_code == 200
    assert len((await snapshot(node))[0]) == 1


async def test_unregister_deletes_the_recipient_and_its_subscriptions(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    await subscribe(node, who, [add(conversation()), add(welcome_topic())])

    response = await call(node, "unregister", who.identity())

    assert response.status_code == 204
    assert await snapshot(node) == [[], []]
    metrics = node.daemon.metrics
    assert metrics.topic_recipients.labels("unregistered")._value.get() == 1
    assert metrics.topic_subscriptions.labels("removed")._value.get() == 2


async def test_an_unknown_recipient_is_not_found_on_unregister_and_subscriptions(
    launch: Launch,
) -> None:
    node = await launch()
    who = Recipient()
    for response in (
        await call(node, "unregister", who.identity()),
        await subscribe(node, who, [add(conversation())]),
    ):
        assert error(response) == (404, "not_found", "recipient is not registered")
    assert await snapshot(node) == [[], []]


# ---------------------------------------------------------------- webhook checks


async def test_a_webhook_recipient_is_registered_with_its_url_and_key(launch: Launch) -> None:
    node = await hooked(launch)
    who = Recipient()
    response = await register(
        node, who, channel="webhook", url=f"https://{HOOK_HOST}/h", signing_key=KEY_32
    )
    assert response.status_code == 200 and response.json()["channel"] == "webhook"
    row = await recipient_row(node, who)
    assert row is not None
    assert row["delivery"] == f"https://{HOOK_HOST}/h" and bytes(row["signing_key"]) == b"k" * 32


@pytest.mark.parametrize(
    "url",
    [
        f"http://{HOOK_HOST}/h",
        "https://elsewhere.example.test/h",
        f"https://user:pw@{HOOK_HOST}/h",
        "https://private.example.test/h",
        "not a url",
        "",
    ],
)
async def test_a_webhook_url_that_is_not_allowed_is_refused(launch: Launch, url: str) -> None:
    node = await hooked(launch)
    response = await register(node, Recipient(), channel="webhook", url=url, signing_key=KEY_32)
    assert error(response) == (400, "invalid_argument", "webhook url is not allowed")
    assert "example" not in response.text
    assert await snapshot(node) == [[], []]


@pytest.mark.parametrize("size", [0, 15, 65])
async def test_a_webhook_key_outside_16_to_64_bytes_is_refused(launch: Launch, size: int) -> None:
    node = await hooked(launch)
    extra = {"signing_key": b64(b"k" * size)} if size else {}
    response = await register(
        node, Recipient(), channel="webhook", url=f"https://{HOOK_HOST}/h", **extra
    )
    assert error(response) == (400, "invalid_argument", "webhook signing key length is not allowed")
    assert await snapshot(node) == [[], []]


# ---------------------------------------------------------------- check order

GOOD_HOOK = f"https://{HOOK_HOST}/h"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # 2 before 4: a malformed request with another's id and a wrong secret
        ("malformed_and_wrong_secret", (400, "invalid_argument", "request is malformed")),
        # 4 before 5: a wrong secret for an unconfigured channel
        (
            "wrong_secret_and_no_channel",
            (403, "permission_denied", "recipient secret is not valid"),
        ),
        # 5 before 6: an unconfigured channel with a bad URL (no webhook block)
        ("no_channel_and_bad_url", (409, "failed_precondition", "channel is not configured")),
        # 6 before 7: a bad URL and a bad key
        ("bad_url_and_bad_key", (400, "invalid_argument", "webhook url is not allowed")),
        # 3 before 8: an unknown recipient with a malformed subscription
        ("unknown_and_bad_subscription", (404, "not_found", "recipient is not registered")),
        # 4 before 8: a wrong secret with a malformed subscription
        (
            "wrong_secret_and_bad_subscription",
            (403, "permission_denied", "recipient secret is not valid"),
        ),
        # 8 before 9: a malformed subscription in a request over the limit
        ("bad_subscription_over_limit", (400, "invalid_argument", "subscription is malformed")),
        # 2 before 3: an undecodable request for an unknown recipient
        ("undecodable_and_unknown", (400, "invalid_argument", "request is malformed")),
    ],
)
async def test_the_first_failing_check_decides_and_nothing_changes(
    launch: Launch, case: str, expected: tuple[int, str, str]
) -> None:
    webhook = case != "no_channel_and_bad_url"
    node = await (hooked(launch, limits={"max_push_topics": 2}) if webhook else launch())
    who = Recipient()
    await register(node, who)
    await subscribe(node, who, [add(conversation()), add(conversation())])
    before = await snapshot(node)
    thief = Recipient(recipient_id=who.recipient_id)
    bad_topic = add(b"\x07" + bytes(16))

    if case == "malformed_and_wrong_secret":
        response = await call(node, "register", {**thief.identity(), "channel": "sms"})
    elif case == "wrong_secret_and_no_channel":
        response = await register(node, thief, channel="apns", token="ab" * 32)
    elif case == "no_channel_and_bad_url":
        response = await register(node, Recipient(), channel="webhook", url="http://x/")
    elif case == "bad_url_and_bad_key":
        response = await register(
            node, Recipient(), channel="webhook", url="http://x/", signing_key=b64(b"k")
        )
    elif case == "unknown_and_bad_subscription":
        response = await subscribe(node, Recipient(), [bad_topic])
    elif case == "wrong_secret_and_bad_subscription":
        response = await subscribe(node, thief, [bad_topic])
    elif case == "bad_subscription_over_limit":
        response = await subscribe(node, who, [add(conversation()), bad_topic])
    else:
        response = await call(node, "subscriptions", {**Recipient().identity(), "adds": "x"})

    assert error(response) == expected
    assert await snapshot(node) == before


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"recipient_id": "AAAA", "recipient_secret": "AAAA", "channel": "fake", "token": "t"}',
    ],
)
async def test_a_body_that_does_not_decode_is_malformed(launch: Launch, body: bytes) -> None:
    node = await launch()
    response = await node.request(
        "POST",
        "/v1/recipients/register",
        content=body,
        token=device_token("a", "b"),
        headers={"content-type": "application/json"},
    )
    assert error(response) == (400, "invalid_argument", "request is malformed")


@pytest.mark.parametrize(
    "extra",
    [
        {"channel": "sms", "token": "t"},
        {"channel": "fake"},
        {"channel": "fake", "token": "t", "url": "https://x/"},
        {"channel": "fake", "token": "t", "environment": "sandbox"},
        {"channel": "apns", "token": "not-hex"},
        {"channel": "apns", "token": "ab" * 32, "environment": "staging"},
        {"channel": "fake", "token": "has space"},
        {"channel": "fake", "token": "t", "colour": "blue"},
    ],
)
async def test_register_fields_that_do_not_fit_the_channel_are_malformed(
    launch: Launch, extra: dict[str, Any]
) -> None:
    node = await launch()
    response = await call(node, "register", {**Recipient().identity(), **extra})
    assert error(response) == (400, "invalid_argument", "request is malformed")


# ---------------------------------------------------------------- subscriptions


async def test_subscriptions_store_start_positions_flags_and_the_count(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    a, b, w = conversation(), conversation(), welcome_topic()
    base = epoch_of(node.clock.now()) - 1
    node.clock.advance(60)

    response = await subscribe(
        node,
        who,
        [add(a, keys=[hmac_key()] * 3, base=base, include_commits=True), add(b), add(w)],
        removes=[conversation()],  # absent: a no-op
    )

    assert response.status_code == 200
    assert response.json()["topic_count"] == 3
    stored = await subscriptions(node, who)
    assert stored[a][1:] == (True, base, True, True, True)
    assert stored[b][1:] == (False, None, False, False, False)  # include_commits defaults to false
    assert stored[w][1:] == (False, None, False, False, False)
    row = await recipient_row(node, who)
    assert row is not None and row["renewed_at"] == node.clock.now() and row["topic_count"] == 3
    metrics = node.daemon.metrics
    assert metrics.topic_subscriptions.labels("added")._value.get() == 3


async def test_adding_a_known_topic_replaces_keys_and_flag_and_keeps_its_start(
    launch: Launch,
) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    topic = conversation()
    await subscribe(node, who, [add(topic)])
    (since, *_rest) = (await subscriptions(node, who))[topic]
    await node.append(
        {"type": "user.upserted", "payload": {"user_id": "u", "kind": "human", "active": True}}
    )
    base = epoch_of(node.clock.now())

    response = await subscribe(
        node, who, [add(topic, keys=[hmac_key(), hmac_key()], base=base, include_commits=True)]
    )

    assert response.json()["topic_count"] == 1
    assert (await subscriptions(node, who))[topic] == (since, True, base, True, True, False)


async def test_removes_delete_rows_and_the_count_follows(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    topics = [conversation() for _ in range(4)]
    await subscribe(node, who, [add(t) for t in topics])

    response = await subscribe(node, who, [add(conversation())], removes=topics[:3])

    assert response.json()["topic_count"] == 2
    count = await node.sql(
        "SELECT count(*) FROM bothy.topic_subscriptions WHERE recipient_id = %s",
        (who.recipient_id,),
    )
    assert count == [(2,)]


async def test_the_topic_limit_allows_exactly_the_bound_and_refuses_one_more(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(limits={"max_push_topics": 3}))
    who = Recipient()
    await register(node, who)
    first = [conversation(), conversation()]
    assert (await subscribe(node, who, [add(t) for t in first])).json()["topic_count"] == 2
    assert (await subscribe(node, who, [add(conversation())])).json()["topic_count"] == 3
    before = await snapshot(node)

    over = await subscribe(node, who, [add(conversation())], removes=[])
    replace_known = await subscribe(node, who, [add(first[0], include_commits=True)])
    swap = await subscribe(node, who, [add(conversation())], removes=[first[1]])

    assert error(over) == (429, "resource_exhausted", "recipient topic limit reached")
    assert replace_known.json()["topic_count"] == 3  # no new topic: not above the bound
    assert swap.json()["topic_count"] == 3  # one out, one in: exactly at the bound
    assert before != await snapshot(node)


async def test_a_refused_over_limit_update_applies_none_of_its_removes(launch: Launch) -> None:
    node = await launch(config=make_config(limits={"max_push_topics": 2}))
    who = Recipient()
    await register(node, who)
    kept = [conversation(), conversation()]
    await subscribe(node, who, [add(t) for t in kept])
    before = await snapshot(node)

    response = await subscribe(
        node, who, [add(conversation()), add(conversation())], removes=[kept[0]]
    )

    assert response.status_code == 429
    assert await snapshot(node) == before


@pytest.mark.parametrize(
    "shape",
    [
        "unknown_kind",
        "short_conversation_id",
        "long_welcome_id",
        "four_keys",
        "short_key",
        "negative_base",
        "twice_in_adds",
        "twice_in_removes",
        "added_and_removed",
        "bad_remove_topic",
    ],
)
async def test_a_malformed_subscription_is_refused_and_nothing_applies(
    launch: Launch, shape: str
) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    before = await snapshot(node)
    topic = conversation()
    good = add(conversation())
    adds: list[dict[str, Any]] = [good]
    removes: list[bytes] = []
    if shape == "unknown_kind":
        adds.append(add(b"\x02" + bytes(16)))
    elif shape == "short_conversation_id":
        adds.append(add(b"\x00" + bytes(15)))
    elif shape == "long_welcome_id":
        adds.append(add(b"\x01" + bytes(33)))
    elif shape == "four_keys":
        adds.append(add(topic, keys=[hmac_key()] * 4, base=1))
    elif shape == "short_key":
        adds.append(add(topic, keys=[bytes(41)], base=1))
    elif shape == "negative_base":
        adds.append(add(topic, keys=[hmac_key()], base=-1))
    elif shape == "twice_in_adds":
        adds += [add(topic), add(topic, include_commits=True)]
    elif shape == "twice_in_removes":
        removes = [topic, topic]
    elif shape == "added_and_removed":
        adds.append(add(topic))
        removes = [topic]
    else:
        removes = [b"\x00" + bytes(3)]

    response = await subscribe(node, who, adds, removes)

    assert error(response) == (400, "invalid_argument", "subscription is malformed")
    assert await snapshot(node) == before


async def test_the_answer_comes_from_the_recipient_row_and_the_ttl(launch: Launch) -> None:
    node = await launch(config=make_config(push={"fake": {}, "recipient_ttl": "2d"}))
    who = Recipient()
    await register(node, who)
    node.clock.advance(7200)
    response = await subscribe(node, who, [add(conversation())])
    expires = node.clock.now() + timedelta(days=2)
    assert response.json() == {
        "topic_count": 1,
        "channel": "fake",
        "expires_at": expires.isoformat().replace("+00:00", "Z"),
    }


async def test_the_topic_count_equals_the_rows_after_every_mutation(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    await register(node, who)
    pool = [conversation() for _ in range(6)]
    steps: list[tuple[list[bytes], list[bytes]]] = [
        (pool[:4], []),
        (pool[2:6], pool[:1]),
        ([], pool[:3]),
        (pool[:2], [pool[5], conversation()]),
    ]
    for adds, removes in steps:
        response = await subscribe(node, who, [add(t) for t in adds], removes)
        rows = await node.sql(
            "SELECT count(*) FROM bothy.topic_subscriptions WHERE recipient_id = %s",
            (who.recipient_id,),
        )
        row = await recipient_row(node, who)
        assert row is not None
        assert response.json()["topic_count"] == row["topic_count"] == rows[0][0]


async def test_no_error_or_answer_names_a_recipient_topic_token_or_url(launch: Launch) -> None:
    node = await hooked(launch)
    who = Recipient()
    await register(node, who, token="tok-visible")
    topic = conversation()
    answers = [
        await subscribe(node, Recipient(recipient_id=who.recipient_id), [add(topic)]),
        await subscribe(node, who, [add(topic), add(topic)]),
        await register(node, Recipient(), channel="webhook", url="https://elsewhere.example/h"),
        await subscribe(node, who, [add(topic)]),
    ]
    secrets = [
        b64(who.recipient_id),
        who.recipient_id.hex(),
        b64(topic),
        topic.hex(),
        b64(who.secret),
        "tok-visible",
        "elsewhere",
    ]
    for response in answers:
        assert not any(s in response.text for s in secrets)
    metrics = node.daemon.metrics.render().decode()
    assert not any(s in metrics for s in secrets)


async def test_an_unreachable_database_answers_503_unavailable() -> None:
    # The offline app's database is never opened: unreachable.
    transport = httpx.ASGITransport(app=offline_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        who = Recipient()
        for token in (DEVICE, producer_token()):
            for path, body in (
                ("register", {**who.identity(), "channel": "fake", "token": "t"}),
                ("unregister", who.identity()),
                ("subscriptions", {**who.identity(), "adds": []}),
            ):
                response = await client.post(
                    f"/v1/recipients/{path}",
                    json=body,
                    headers={"authorization": f"Bearer {token}"},
                )
                assert error(response) == (503, "unavailable", "the database is unavailable")


@pytest.mark.parametrize("field", ["environment", "token", "url", "signing_key"])
async def test_a_member_given_as_null_is_malformed(launch: Launch, field: str) -> None:
    node = await launch()
    body: dict[str, Any] = {**Recipient().identity(), "channel": "fake", "token": "t", field: None}
    answer = await call(node, "register", body)
    assert error(answer) == (400, "invalid_argument", "request is malformed")
    assert await snapshot(node) == [[], []]
