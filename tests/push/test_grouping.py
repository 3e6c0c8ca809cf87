"""Threads grouped on the phone (issue 33, item 4), and the ``removed`` push on every
provider.

The grouping value is an HMAC of the thread id under the server key; APNs carries it
as ``apns-collapse-id`` (and ``aps.thread-id`` alert style), FCM as the data member
``tag`` (and ``apns-collapse-id`` for Apple devices), Web Push as ``Topic``: each
provider against its protocol-speaking fake, no thread id in any of these places.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import trio
import trustme
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.config import ApnsStyle, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.fcm import FcmProvider
from bothy_notify.push.grouping import GROUP_LENGTH, ThreadGrouping, new_key
from bothy_notify.push.port import (
    OutcomeKind,
    PushMessage,
    ReadMessage,
    Registrant,
    RemovedMessage,
    Target,
)
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webhook import WebhookProvider
from bothy_notify.push.webpush import WebPushProvider, registrant
from testkit.fakes.apns import FakeApns
from testkit.fakes.fcm import FakeFcm
from testkit.fakes.webhook import HOST as HOOK_HOST
from testkit.fakes.webhook import SIGNING_KEY, WebhookReceiver
from testkit.fakes.webpush import HOST as PUSH_HOST
from testkit.fakes.webpush import FakePushService
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

THREAD = "support:thread-of-alex"
KEY = "a-test-grouping-key"
GROUP = ThreadGrouping(KEY).of(THREAD)
HINT = PushMessage(
    nid="0190c0de-0000-7000-8000-00000000000a",
    kind="mention",
    count=1,
    quiet=False,
    thread_id=THREAD,
    message_id="m1",
    group=GROUP,
)
REMOVED = RemovedMessage(THREAD, "m1", badge=2, urgency="low", group=GROUP)
BASE64URL = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def target(provider: str, token: str, platform: str = "ios", **extra: object) -> Target:
    return Target(
        registration_id="reg-9",
        user_id="alex",
        provider=provider,
        token=token,
        platform=platform,
        **extra,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------- the value


def test_the_value_is_the_hmac_of_the_thread_id_in_32_base64url_characters() -> None:
    digest = hmac.new(KEY.encode(), THREAD.encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64encode(digest).decode()[:32] == GROUP
    assert len(GROUP) == GROUP_LENGTH and set(GROUP) <= BASE64URL
    assert THREAD not in GROUP


def test_one_thread_one_value_under_one_key_and_another_under_another() -> None:
    grouping = ThreadGrouping(KEY)
    assert grouping.of(THREAD) == grouping.of(THREAD) == GROUP
    assert grouping.of("t2") != GROUP
    assert ThreadGrouping(new_key()).of(THREAD) != GROUP
    assert new_key() != new_key()
    assert "a-test" not in repr(grouping)


def test_a_long_thread_id_still_gives_32_characters() -> None:
    assert len(ThreadGrouping(KEY).of("x" * 128)) == GROUP_LENGTH


# ---------------------------------------------------------------- APNs


def apns_provider(
    fake: FakeApns, key: ApnsKey, ca_file: str, clock: FakeClock, style: ApnsStyle
) -> ApnsProvider:
    return ApnsProvider(
        credentials=ApnsCredentials(key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=clock,
        style=style,
        hosts={"production": fake.url, "sandbox": fake.other_url},
        ca_file=ca_file,
    )


async def test_apns_alert_style_carries_thread_id_and_collapse_id_as_the_value(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = apns_provider(fake_apns, apns_key, ca_file, now_clock, ApnsStyle.ALERT)
    await apns.send(target("apns", "ab" * 32), HINT)
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "alert"
    assert request.body["aps"]["thread-id"] == GROUP
    assert request.headers["apns-collapse-id"] == GROUP
    assert THREAD not in str(request.headers) and THREAD not in str(request.body["aps"])


async def test_apns_sends_removed_background_collapsed_on_the_value(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = apns_provider(fake_apns, apns_key, ca_file, now_clock, ApnsStyle.ALERT)
    outcome = await apns.send(target("apns", "ab" * 32), REMOVED)
    await apns.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "background"
    assert request.headers["apns-priority"] == "5"
    assert request.headers["apns-collapse-id"] == GROUP
    assert request.body == {
        "aps": {"content-available": 1},
        "kind": "removed",
        "thread_id": THREAD,
        "message_id": "m1",
        "badge": 2,
        "urgency": "low",
    }


async def test_apns_without_a_value_sends_no_collapse_id_never_the_thread_id(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = apns_provider(fake_apns, apns_key, ca_file, now_clock, ApnsStyle.ALERT)
    await apns.send(target("apns", "ab" * 32), ReadMessage(THREAD, 3))
    await apns.aclose()

    (request,) = fake_apns.requests
    assert "apns-collapse-id" not in request.headers


# ---------------------------------------------------------------- FCM


def fcm_provider(fake: FakeFcm, ca_file: str, clock: FakeClock) -> FcmProvider:
    config = structure_config(
        {
            "push": {
                "fcm": {"service_account": "env:FCM_SA", "endpoint": fake.url, "ca_file": ca_file}
            }
        },
        env={"FCM_SA": fake.service_account(None)},
    )
    assert config.push.fcm is not None
    return FcmProvider.from_config(config.push.fcm, clock=clock)


async def test_fcm_carries_the_value_as_tag_and_as_apple_collapse_id_never_a_collapse_key(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm_provider(fake_fcm, ca_file, now_clock)
    await provider.send(target("fcm", "fcm-token", "android"), HINT)
    await provider.aclose()

    (request,) = fake_fcm.requests
    message = request.body["message"]
    assert message["data"]["tag"] == GROUP
    assert message["apns"]["headers"]["apns-collapse-id"] == GROUP
    assert "collapse_key" not in message["android"] and "notification" not in message


async def test_fcm_sends_removed_as_data_of_strings(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm_provider(fake_fcm, ca_file, now_clock)
    outcome = await provider.send(target("fcm", "fcm-token", "android"), REMOVED)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (request,) = fake_fcm.requests
    message = request.body["message"]
    assert message["data"] == {
        "kind": "removed",
        "thread_id": THREAD,
        "message_id": "m1",
        "badge": "2",
        "urgency": "low",
        "tag": GROUP,
    }
    assert message["android"] == {"priority": "NORMAL"}


# ---------------------------------------------------------------- Web Push


@pytest.fixture
async def service(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[FakePushService]:
    fake = FakePushService(ca=ca)
    await nursery.start(fake.serve)
    yield fake


async def test_webpush_topic_is_the_value_and_removed_is_encrypted_like_every_push(
    service: FakePushService, ca_file: str, now_clock: FakeClock
) -> None:
    sender = WebPushProvider(
        key=ec.generate_private_key(ec.SECP256R1()),
        subject="mailto:ops@bothy.test",
        allowed_endpoints=(PUSH_HOST,),
        allow_private_addresses=True,
        clock=now_clock,
        ttl=timedelta(minutes=30),
        resolver=FakeResolver({PUSH_HOST: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    browser = service.subscribe("s1")
    found = registrant({"subscription": browser.subscription()})
    assert isinstance(found, Registrant)
    to = target("webpush", found.token, "web", signing_key=found.secret)
    assert (await sender.send(to, HINT)).kind is OutcomeKind.DELIVERED
    assert (await sender.send(to, REMOVED)).kind is OutcomeKind.DELIVERED
    await sender.aclose()

    hint, removed = service.pushes
    assert hint.headers["topic"] == removed.headers["topic"] == GROUP
    assert removed.payload == REMOVED.payload()
    assert THREAD not in str(hint.headers)


# ---------------------------------------------------------------- webhook, fake


@pytest.fixture
async def receiver(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver(ca=ca)
    await nursery.start(hooks.serve)
    yield hooks


async def test_a_webhook_receives_removed_signed_with_an_id_per_message(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = WebhookProvider(
        allowed_domains=(HOOK_HOST,),
        allow_private_addresses=True,
        resolver=FakeResolver({HOOK_HOST: ["127.0.0.1"]}),
        clock=now_clock,
        ca_file=ca_file,
    )
    to = target("webhook", receiver.url(), "web", signing_key=SIGNING_KEY)
    assert (await provider.send(to, REMOVED)).kind is OutcomeKind.DELIVERED
    assert (await provider.send(to, REMOVED)).kind is OutcomeKind.DELIVERED
    await provider.aclose()

    first, again = receiver.deliveries
    assert first.verified
    assert first.body == {**REMOVED.payload(), "user_id": "alex", "registration_id": "reg-9"}
    assert first.headers["webhook-id"] == again.headers["webhook-id"]  # a retry, the same id
    assert THREAD not in first.headers["webhook-id"]


async def test_the_fake_provider_records_removed() -> None:
    fake = FakeProvider()
    assert (await fake.send(target("fake", "phone"), REMOVED)).kind is OutcomeKind.DELIVERED
    (sent,) = fake.sends
    assert sent.payload == REMOVED.payload()
