"""Topic-mode pushes through the real providers, against the protocol fakes: the
payload shapes of APNs, FCM and webhooks (PUSH-060, 062, 064, 067) and what their
answers do to the recipient (PUSH-046, 061, 063, 065)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trustme

from bothy_notify.config import ApnsStyle
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider
from bothy_notify.push.fcm import FcmProvider
from bothy_notify.push.port import PushProvider
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webhook import WebhookProvider
from bothy_notify.topics.model import b64
from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.fcm import FakeFcm, FcmAnswer, error_body
from testkit.fakes.webhook import HOST, SIGNING_KEY, WebhookReceiver
from tests.harness import Launch, Node, make_config
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey
from tests.topics.helpers import Recipient, add, conversation, envelope, register, subscribe

APNS_TOKEN = "cd" * 32
FCM_TOKEN = "fcm-token-topic"
WEBHOOK_KEY = SIGNING_KEY.removeprefix("whsec_")


def apns(fake: FakeApns, key: ApnsKey, ca_file: str, clock: FakeClock, **kw: Any) -> ApnsProvider:
    return ApnsProvider(
        credentials=ApnsCredentials(key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=clock,
        hosts={"production": fake.url, "sandbox": fake.url},
        ca_file=ca_file,
        **kw,
    )


def fcm(fake: FakeFcm, ca_file: str, clock: FakeClock) -> FcmProvider:
    return fake.provider(ca_file, clock)


@pytest.fixture
async def receiver(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver(ca=ca)
    await nursery.start(hooks.serve)
    yield hooks


def hooks(clock: FakeClock, ca_file: str) -> WebhookProvider:
    return WebhookProvider(
        allowed_domains=(HOST,),
        allow_private_addresses=True,
        resolver=FakeResolver({HOST: ["127.0.0.1"]}),
        clock=clock,
        ca_file=ca_file,
    )


async def start(
    launch: Launch, clock: FakeClock, providers: dict[str, PushProvider], **push: Any
) -> Node:
    return await launch(config=make_config(push=push), providers=providers, clock=clock)


async def subscribed(node: Node, channel: str, **delivery: Any) -> tuple[Recipient, bytes]:
    who, topic = Recipient(), conversation()
    response = await register(node, who, channel=channel, **delivery)
    assert response.status_code == 200, response.text
    assert (await subscribe(node, who, [add(topic)])).status_code == 200
    return who, topic


async def exists(node: Node, who: Recipient) -> bool:
    rows = await node.sql(
        "SELECT 1 FROM bothy.topic_recipients WHERE recipient_id = %s", (who.recipient_id,)
    )
    return bool(rows)


def count(node: Node, channel: str, outcome: str) -> float:
    return float(node.daemon.metrics.topic_deliveries.labels(channel, outcome)._value.get())


# ---------------------------------------------------------------- APNs


@pytest.mark.parametrize("style", [ApnsStyle.BACKGROUND, ApnsStyle.ALERT])
async def test_apns_topic_push_is_background_priority_5_collapsed_by_topic(
    launch: Launch,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    style: ApnsStyle,
) -> None:
    provider = apns(fake_apns, apns_key, ca_file, now_clock, style=style)
    node = await start(launch, now_clock, {"apns": provider})
    _who, topic = await subscribed(node, "apns", token=APNS_TOKEN, environment="sandbox")
    (seq,) = await node.append(envelope(topic, data=b"never in a push"))
    await node.settle()

    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "background"
    assert request.headers["apns-priority"] == "5"
    assert request.headers["apns-collapse-id"] == b64(topic)
    assert request.body == {
        "aps": {"content-available": 1},
        "topic": b64(topic),
        "sequence_id": str(seq),
    }
    assert count(node, "apns", "delivered") == 1


@pytest.mark.parametrize(
    ("answer", "kept", "outcome"),
    [
        (Answer(410, "Unregistered"), False, "dead"),
        (Answer(410, "ExpiredToken"), False, "dead"),
        (Answer(400, "BadDeviceToken"), True, "mismatch"),
        (Answer(400, "DeviceTokenNotForTopic"), True, "mismatch"),
        (Answer(413, "PayloadTooLarge"), True, "rejected"),
    ],
)
async def test_apns_answers_delete_only_dead_recipients(
    launch: Launch,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    answer: Answer,
    kept: bool,
    outcome: str,
) -> None:
    node = await start(launch, now_clock, {"apns": apns(fake_apns, apns_key, ca_file, now_clock)})
    who, topic = await subscribed(node, "apns", token=APNS_TOKEN)
    fake_apns.answer(APNS_TOKEN, answer)
    await node.append(envelope(topic))
    await node.settle()
    await node.advance(5)

    assert fake_apns.count == 1  # one attempt each
    assert await exists(node, who) is kept
    assert count(node, "apns", outcome) == 1
    dead = node.daemon.metrics.topic_recipients.labels("dead")._value.get()
    assert dead == (0 if kept else 1)


async def test_apns_transient_answers_retry_then_count_failed_and_keep(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(
        launch,
        now_clock,
        {"apns": apns(fake_apns, apns_key, ca_file, now_clock)},
        max_attempts=3,
    )
    who, topic = await subscribed(node, "apns", token=APNS_TOKEN)
    fake_apns.answer(APNS_TOKEN, *[Answer(503, "ServiceUnavailable")] * 3)
    await node.append(envelope(topic))
    await node.settle()
    await node.advance(2)
    await node.advance(4)

    assert fake_apns.count == 3
    assert await exists(node, who)
    assert count(node, "apns", "failed") == 1
    (job,) = await node.jobs("topics.push_send")
    assert job["state"] == "failed"


# ---------------------------------------------------------------- FCM


async def test_fcm_topic_push_is_data_only_without_a_collapse_key(
    launch: Launch, fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, now_clock, {"fcm": fcm(fake_fcm, ca_file, now_clock)})
    _who, topic = await subscribed(node, "fcm", token=FCM_TOKEN)
    (seq,) = await node.append(envelope(topic))
    await node.settle()

    (request,) = fake_fcm.requests
    message = request.body["message"]
    assert message["data"] == {"topic": b64(topic), "sequence_id": str(seq)}
    assert message["android"] == {"priority": "HIGH"}
    assert "collapse_key" not in str(request.body) and "notification" not in message
    assert count(node, "fcm", "delivered") == 1


@pytest.mark.parametrize(
    ("answer", "kept"),
    [
        (FcmAnswer(404, error_body(404, "NOT_FOUND", fcm="UNREGISTERED")), False),
        (FcmAnswer(403, error_body(403, "PERMISSION_DENIED", fcm="SENDER_ID_MISMATCH")), True),
        (FcmAnswer(400, error_body(400, "INVALID_ARGUMENT", fcm="INVALID_ARGUMENT")), True),
    ],
)
async def test_fcm_unregistered_deletes_and_mismatch_or_invalid_keeps(
    launch: Launch,
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    answer: FcmAnswer,
    kept: bool,
) -> None:
    node = await start(launch, now_clock, {"fcm": fcm(fake_fcm, ca_file, now_clock)})
    who, topic = await subscribed(node, "fcm", token=FCM_TOKEN)
    fake_fcm.answer(FCM_TOKEN, answer)
    await node.append(envelope(topic))
    await node.settle()

    assert len(fake_fcm.requests) == 1
    assert await exists(node, who) is kept


# ---------------------------------------------------------------- webhooks


async def test_a_webhook_topic_push_is_signed_with_the_recipients_key(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, now_clock, {"webhook": hooks(now_clock, ca_file)})
    who, topic = await subscribed(node, "webhook", url=receiver.url(), signing_key=WEBHOOK_KEY)
    (seq,) = await node.append(envelope(topic))
    await node.settle()

    (delivery,) = receiver.deliveries
    assert delivery.verified  # standardwebhooks checked the signature with the key
    assert delivery.body == {
        "topic": b64(topic),
        "sequence_id": str(seq),
        "recipient_id": who.recipient_id.hex(),
    }
    assert delivery.headers["webhook-id"].startswith(f"{seq}.")


@pytest.mark.parametrize(
    ("answers", "kept", "job_state"),
    [
        ((404, 404, 404), False, "completed"),
        ((410, 404, 410), False, "completed"),
        ((404, 500, 404), True, "failed"),
        ((404, 200), True, "completed"),
    ],
)
async def test_a_webhook_recipient_is_dead_only_when_every_attempt_answered_404_or_410(
    launch: Launch,
    receiver: WebhookReceiver,
    ca_file: str,
    now_clock: FakeClock,
    answers: tuple[int, ...],
    kept: bool,
    job_state: str,
) -> None:
    node = await start(launch, now_clock, {"webhook": hooks(now_clock, ca_file)}, max_attempts=3)
    who, topic = await subscribed(node, "webhook", url=receiver.url(), signing_key=WEBHOOK_KEY)
    receiver.answer("/hook", *answers)
    await node.append(envelope(topic))
    await node.settle()
    for _ in range(len(answers) - 1):
        await node.advance(5)

    assert len(receiver.deliveries) == len(answers)
    assert await exists(node, who) is kept
    (job,) = await node.jobs("topics.push_send")
    assert job["state"] == job_state
