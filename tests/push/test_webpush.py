"""The Web Push provider against a fake push service that verifies the VAPID JWT and
decrypts every push with the subscription's private key, as the browser would."""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.config import ConfigError, Secret
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.lookups import parse_endpoint
from bothy_notify.push.port import OutcomeKind, PushMessage, Refusal, Registrant, Target
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.transport import NoAnswer
from bothy_notify.push.webpush import (
    WebPushProvider,
    generate_vapid_key,
    load_vapid_key,
    public_key_b64,
    registrant,
    topic_header,
    unpack_keys,
    webpush_outcome,
)
from testkit.fakes.webpush import HOST, Browser, FakePushService, PushAnswer

THREAD = "thread-with-a-secret-name"
MESSAGE = PushMessage(
    nid="0190c0de-0000-7000-8000-000000000007",
    kind="message",
    count=2,
    quiet=False,
    thread_id=THREAD,
    message_id="m9",
    mv="0123456789abcdef",
    group=ThreadGrouping("a-test-grouping-key").of(THREAD),
)


@pytest.fixture(scope="session")
def vapid() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
async def service(
    nursery: trio.Nursery, ca: trustme.CA, vapid: ec.EllipticCurvePrivateKey
) -> AsyncIterator[FakePushService]:
    fake = FakePushService(ca=ca, server_key=public_key_b64(vapid))
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the provider broke a push service rule"


def provider(
    vapid: ec.EllipticCurvePrivateKey,
    clock: FakeClock,
    ca_file: str,
    *,
    resolver: FakeResolver | None = None,
    private: bool = True,
    allowed: tuple[str, ...] = (HOST, "localhost"),
    bound: float = 10.0,
) -> WebPushProvider:
    return WebPushProvider(
        key=vapid,
        subject="mailto:ops@bothy.test",
        allowed_endpoints=allowed,
        allow_private_addresses=private,
        clock=clock,
        ttl=timedelta(minutes=30),
        resolver=resolver or FakeResolver({HOST: ["127.0.0.1"], "localhost": ["127.0.0.1"]}),
        ca_file=ca_file,
        request_bound=bound,
    )


def target(browser: Browser, **extra: object) -> Target:
    found = registrant({"subscription": browser.subscription()})
    assert isinstance(found, Registrant)
    return Target(
        registration_id="reg-7",
        user_id="alex",
        provider="webpush",
        token=found.token,
        platform="web",
        signing_key=found.secret,
        **extra,  # type: ignore[arg-type]
    )


async def test_a_push_is_encrypted_for_the_subscription_and_signed_with_vapid(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    sender = provider(vapid, now_clock, ca_file, resolver=resolver)
    browser = service.subscribe("s1")
    outcome = await sender.send(target(browser), MESSAGE)
    await sender.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (push,) = service.pushes
    # Decrypted with the browser's private key: exactly the content-free payload.
    assert push.payload == MESSAGE.payload()
    assert push.headers["ttl"] == "1800"
    assert push.headers["urgency"] == "normal"
    assert push.headers["content-encoding"] == "aes128gcm"
    assert push.headers["topic"] == MESSAGE.group  # the thread's grouping value
    assert THREAD not in str(push.headers)
    assert push.claims["aud"] == f"https://{HOST}:{service.port}"
    assert push.claims["sub"] == "mailto:ops@bothy.test"
    assert push.claims["exp"] <= now_clock.now().timestamp() + 24 * 3600
    # push.bothy.test exists only in the fake resolver: the connection went to the
    # address that was checked, TLS and Host naming the endpoint's host.
    assert push.host == f"{HOST}:{service.port}"
    assert resolver.lookups == 1


async def test_the_vapid_jwt_is_cached_per_origin_until_near_its_expiry(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    sender = provider(vapid, now_clock, ca_file)
    first, second = service.subscribe("a"), service.subscribe("b")
    other = service.subscribe("c", host="localhost")
    for browser in (first, second, first):
        assert (await sender.send(target(browser), MESSAGE)).kind is OutcomeKind.DELIVERED
    assert sender.vapid.minted == 1
    await sender.send(target(other), MESSAGE)  # another origin: its own JWT
    assert sender.vapid.minted == 2
    now_clock.advance(11 * 3600 + 1)  # within the last hour of the JWT's 12
    await sender.send(target(first), MESSAGE)
    await sender.aclose()
    assert sender.vapid.minted == 3
    assert len({p.headers["authorization"] for p in service.pushes}) == 3
    assert {p.claims["aud"] for p in service.pushes} == {
        f"https://{HOST}:{service.port}",
        f"https://localhost:{service.port}",
    }


@pytest.mark.parametrize(
    ("answer", "kind", "reason", "retry"),
    [
        (PushAnswer(200), OutcomeKind.DELIVERED, "", None),
        (PushAnswer(201), OutcomeKind.DELIVERED, "", None),
        (PushAnswer(202), OutcomeKind.DELIVERED, "", None),
        (PushAnswer(404), OutcomeKind.DEAD, "http_404", None),
        (PushAnswer(410), OutcomeKind.DEAD, "http_410", None),
        (PushAnswer(413), OutcomeKind.REJECTED, "http_413", None),
        (PushAnswer(400), OutcomeKind.REJECTED, "http_400", None),
        (PushAnswer(401), OutcomeKind.REJECTED, "http_401", None),
        (PushAnswer(403), OutcomeKind.REJECTED, "http_403", None),
        (PushAnswer(429, (("retry-after", "30"),)), OutcomeKind.TRANSIENT, "http_429", 30),
        (PushAnswer(429, (("retry-after", "3600"),)), OutcomeKind.TRANSIENT, "http_429", 300),
        (PushAnswer(500), OutcomeKind.TRANSIENT, "http_500", 1),
        (PushAnswer(503), OutcomeKind.TRANSIENT, "http_503", 1),
        (
            PushAnswer(301, (("location", "https://elsewhere/"),)),
            OutcomeKind.REJECTED,
            "redirect",
            None,
        ),
    ],
)
async def test_each_push_service_answer_becomes_its_outcome(
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    answer: PushAnswer,
    kind: OutcomeKind,
    reason: str,
    retry: int | None,
) -> None:
    sender = provider(vapid, now_clock, ca_file)
    browser = service.subscribe("s")
    service.answer("s", answer)
    outcome = await sender.send(target(browser), MESSAGE)
    await sender.aclose()
    assert (outcome.kind, outcome.reason) == (kind, reason)
    assert not outcome.ours
    if retry is not None:
        assert outcome.retry_after == timedelta(seconds=retry)
    assert len(service.pushes) == 1  # one request: a redirect is never followed


async def test_a_refusal_of_our_vapid_is_logged_once_a_minute_naming_the_keys(
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = provider(vapid, now_clock, ca_file)
    browser = service.subscribe("s")
    service.answer("s", PushAnswer(403), PushAnswer(403))
    with caplog.at_level(logging.WARNING, logger="bothy.push.webpush"):
        for _ in range(2):
            await sender.send(target(browser), MESSAGE)
    await sender.aclose()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "push.webpush.vapid_private_key" in line and "push.webpush.subject" in line
    assert HOST not in line and "/push/" not in line


async def test_no_answer_is_transient_and_ours(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    sender = provider(vapid, now_clock, ca_file, bound=0.5)
    browser = service.subscribe("s")
    service.answer("s", PushAnswer(stall=True))
    timed_out = await sender.send(target(browser), MESSAGE)
    refused = await sender.send(
        target(Browser("x", "https://localhost:1/push/x", browser.private, browser.auth)),
        MESSAGE,
    )
    unknown = await sender.send(
        target(Browser("y", "https://nowhere.bothy.test/push/y", browser.private, browser.auth)),
        MESSAGE,
    )
    await sender.aclose()
    assert (timed_out.kind, timed_out.reason, timed_out.ours) == (
        OutcomeKind.TRANSIENT,
        "timeout",
        True,
    )
    assert (refused.kind, refused.reason, refused.ours) == (
        OutcomeKind.TRANSIENT,
        "connect_error",
        True,
    )
    assert (unknown.kind, unknown.reason) == (OutcomeKind.REJECTED, "endpoint_not_allowed")


async def test_a_subscription_past_its_expiration_time_is_dead_without_a_send(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    sender = provider(vapid, now_clock, ca_file)
    browser = service.subscribe("s")
    past = target(browser, expires_at=now_clock.now() - timedelta(seconds=1))
    future = target(browser, expires_at=now_clock.now() + timedelta(days=1))
    assert (await sender.send(past, MESSAGE)).kind is OutcomeKind.DEAD
    assert service.pushes == []
    assert (await sender.send(future, MESSAGE)).kind is OutcomeKind.DELIVERED
    await sender.aclose()


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "64:ff9b:1::a00:1", "fec0::1"]
)
async def test_a_push_service_host_resolving_to_a_private_address_is_refused(
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    address: str,
) -> None:
    sender = provider(
        vapid, now_clock, ca_file, resolver=FakeResolver({HOST: [address]}), private=False
    )
    outcome = await sender.send(target(service.subscribe("s")), MESSAGE)
    await sender.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "private_address")
    assert service.pushes == []


async def test_an_endpoint_whose_host_left_allowed_endpoints_is_not_contacted(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    sender = provider(vapid, now_clock, ca_file, allowed=("fcm.googleapis.com",))
    outcome = await sender.send(target(service.subscribe("s")), MESSAGE)
    assert await sender.check_registration(service.subscribe("t").endpoint) == (
        "subscription.endpoint",
        "the push service's host is not in push.webpush.allowed_endpoints",
    )
    await sender.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "endpoint_not_allowed")
    assert service.pushes == []


async def test_a_stored_endpoint_in_another_spelling_is_sent_in_its_one_spelling(
    service: FakePushService, vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    """A registration stored before endpoints had one spelling (upper case, a trailing
    dot, ``:443`` spelled out) goes to the same push service with the same ``aud``."""
    sender = provider(vapid, now_clock, ca_file)
    browser = service.subscribe("s")
    shouting = browser.endpoint.replace(HOST, HOST.upper() + ".")
    outcome = await sender.send(dataclasses.replace(target(browser), token=shouting), MESSAGE)
    await sender.aclose()
    assert outcome.kind is OutcomeKind.DELIVERED
    (push,) = service.pushes
    assert push.claims["aud"] == f"https://{HOST}:{service.port}"
    assert push.host == f"{HOST}:{service.port}"


@pytest.mark.parametrize("port", ["0", "99999", "65536", "0443"])
async def test_a_stored_endpoint_with_a_port_outside_1_to_65535_is_not_contacted(
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    port: str,
) -> None:
    sender = provider(vapid, now_clock, ca_file)
    browser = service.subscribe("s")
    bad = dataclasses.replace(target(browser), token=f"https://{HOST}:{port}/push/s")
    outcome = await sender.send(bad, MESSAGE)
    await sender.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "not_https")
    assert service.pushes == []


def test_the_outcome_of_no_answer_and_of_other_statuses() -> None:
    assert webpush_outcome(NoAnswer("tls_error")).ours
    assert webpush_outcome(405).kind is OutcomeKind.REJECTED
    assert webpush_outcome(204).kind is OutcomeKind.REJECTED


def test_a_topic_pushs_topic_is_a_digest_cut_to_32_base64url_characters() -> None:
    topic = topic_header(b"t" * 500)
    assert len(topic) == 32 and set(topic) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    assert topic_header(b"a") != topic_header(b"b")


# ---------------------------------------------------------------- the subscription


def subscription(**changes: object) -> dict[str, object]:
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    point = key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    base: dict[str, object] = {
        "endpoint": "https://fcm.googleapis.com/fcm/send/abc:def",
        "expirationTime": None,
        "keys": {
            "p256dh": base64.urlsafe_b64encode(point).decode().rstrip("="),
            "auth": base64.urlsafe_b64encode(b"0123456789abcdef").decode().rstrip("="),
        },
    }
    base.update(changes)
    return base


def off_curve() -> str:
    point = bytearray(b"\x04" + b"\x01" * 64)
    return base64.urlsafe_b64encode(bytes(point)).decode().rstrip("=")


def compressed() -> str:
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    point = key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )
    return base64.urlsafe_b64encode(point).decode().rstrip("=")


AUTH = base64.urlsafe_b64encode(b"0123456789abcdef").decode()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "subscription"),
        ({"subscription": "x"}, "subscription"),
        ({"subscription": subscription(extra=1)}, "subscription"),
        (
            {"subscription": subscription(endpoint="http://fcm.googleapis.com/x")},
            "subscription.endpoint",
        ),
        (
            {"subscription": subscription(endpoint="https://a:b@fcm.googleapis.com/x")},
            "subscription.endpoint",
        ),
        (
            {"subscription": subscription(endpoint="https://fcm.googleapis.com/" + "x" * 2100)},
            "subscription.endpoint",
        ),
        ({"subscription": subscription(keys=None)}, "subscription.keys"),
        (
            {"subscription": subscription(keys={"p256dh": off_curve(), "auth": AUTH})},
            "subscription.keys.p256dh",
        ),
        (
            {"subscription": subscription(keys={"p256dh": compressed(), "auth": AUTH})},
            "subscription.keys.p256dh",
        ),
        (
            {"subscription": subscription(keys={"p256dh": "!!", "auth": AUTH})},
            "subscription.keys.p256dh",
        ),
        (
            {"subscription": subscription(keys={"p256dh": compressed()[:10], "auth": AUTH})},
            "subscription.keys.p256dh",
        ),
        (
            {"subscription": subscription(keys={"p256dh": off_curve(), "auth": AUTH, "x": 1})},
            "subscription.keys",
        ),
    ],
)
def test_a_bad_subscription_is_refused_naming_the_field(body: dict, field: str) -> None:
    found = registrant(body)
    assert isinstance(found, Refusal) and found.field == field


@pytest.mark.parametrize("auth", [b"0123456789abcde", b"0123456789abcdef0", b""])
def test_an_auth_secret_that_is_not_16_bytes_is_refused(auth: bytes) -> None:
    keys = dict(subscription()["keys"])  # type: ignore[call-overload]
    keys["auth"] = base64.urlsafe_b64encode(auth).decode().rstrip("=")
    found = registrant({"subscription": subscription(keys=keys)})
    assert found == Refusal("subscription.keys.auth", "expected the base64url of 16 bytes")


@pytest.mark.parametrize("value", ["soon", True, -5, float("inf")])
def test_an_expiration_time_that_is_not_milliseconds_is_refused(value: object) -> None:
    found = registrant({"subscription": subscription(expirationTime=value)})
    assert isinstance(found, Refusal) and found.field == "subscription.expirationTime"


@pytest.mark.parametrize(
    ("endpoint", "stored", "aud"),
    [
        (
            "https://push.example.com/s/1",
            "https://push.example.com/s/1",
            "https://push.example.com",
        ),
        (
            "https://Push.Example.COM/s/1",
            "https://push.example.com/s/1",
            "https://push.example.com",
        ),
        (
            "https://push.example.com./s/1",
            "https://push.example.com/s/1",
            "https://push.example.com",
        ),
        (
            "https://PUSH.example.com.:443/s",
            "https://push.example.com/s",
            "https://push.example.com",
        ),
        (
            "https://push.example.com:1/s",
            "https://push.example.com:1/s",
            "https://push.example.com:1",
        ),
        (
            "https://push.example.com:22/s",
            "https://push.example.com:22/s",
            "https://push.example.com:22",
        ),
        (
            "https://push.example.com:65535/s",
            "https://push.example.com:65535/s",
            "https://push.example.com:65535",
        ),
        (
            "https://push.example.com:8443",
            "https://push.example.com:8443",
            "https://push.example.com:8443",
        ),
        (
            "https://[2001:DB8::1]:9000/s",
            "https://[2001:db8::1]:9000/s",
            "https://[2001:db8::1]:9000",
        ),
        ("https://push.example.com:0/s", None, None),
        ("https://push.example.com:99999/s", None, None),
        ("https://push.example.com:65536/s", None, None),
        ("https://push.example.com:0443/s", None, None),
        ("https://push.example.com:/s", None, None),
        ("https://.../s", None, None),
    ],
)
def test_an_endpoint_is_stored_in_one_spelling_with_a_port_of_1_to_65535(
    endpoint: str, stored: str | None, aud: str | None
) -> None:
    found = registrant({"subscription": subscription(endpoint=endpoint)})
    parsed = parse_endpoint(endpoint)
    if stored is None:
        assert isinstance(found, Refusal) and found.field == "subscription.endpoint"
        assert parsed is None
        return
    assert isinstance(found, Registrant) and found.token == stored
    assert parsed is not None and (parsed.url, parsed.origin) == (stored, aud)
    assert parse_endpoint(stored) == parsed  # the stored spelling reads the same


async def test_the_allowed_hosts_are_checked_on_the_one_spelling(
    vapid: ec.EllipticCurvePrivateKey, ca_file: str, now_clock: FakeClock
) -> None:
    sender = provider(vapid, now_clock, ca_file, allowed=("push.example.com",))
    assert await sender.check_registration("https://PUSH.Example.com./s") is None
    assert await sender.check_registration("https://push.example.com:0/s") == (
        "subscription.endpoint",
        "expected an https URL without credentials",
    )
    await sender.aclose()


def test_a_subscription_is_read_as_the_browser_gives_it() -> None:
    body = subscription(expirationTime=1_900_000_000_000)
    found = registrant({"subscription": body})
    assert isinstance(found, Registrant)
    assert found.token == body["endpoint"]
    assert found.expires_at is not None and found.expires_at.year == 2030
    keys = unpack_keys(found.secret)
    assert keys is not None and len(keys[0]) == 65 and keys[1] == b"0123456789abcdef"
    assert "fcm" not in repr(found)


# ---------------------------------------------------------------- VAPID keys


def test_a_vapid_key_is_read_as_pem_or_as_the_raw_base64url_scalar() -> None:
    pem, public = generate_vapid_key()
    key = load_vapid_key(Secret("literal", pem), "push.webpush.vapid_private_key")
    assert public_key_b64(key) == public
    raw = key.private_numbers().private_value.to_bytes(32, "big")
    text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    again = load_vapid_key(Secret("literal", text), "push.webpush.vapid_private_key")
    assert public_key_b64(again) == public
    assert len(base64.urlsafe_b64decode(public + "=")) == 65


@pytest.mark.parametrize("value", ["", "not a key", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END"])
def test_a_bad_vapid_key_fails_startup_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_vapid_key(Secret("literal", value), "push.webpush.apps.web.vapid_private_key")
    assert str(caught.value).startswith("push.webpush.apps.web.vapid_private_key: ")
    assert value not in str(caught.value) or not value
