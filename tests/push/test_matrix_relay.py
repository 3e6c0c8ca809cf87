"""The Matrix relay provider against a fake upstream push gateway over TLS: what a
notify request carries, what its answer does, and where a request may go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import trio
import trustme

from bothy_notify.config import ConfigError, MatrixRelayConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.matrix import (
    MatrixRelayProvider,
    matrix_outcome,
    prepare,
    registrant,
)
from bothy_notify.push.port import (
    MatrixMessage,
    Outcome,
    OutcomeKind,
    PushMessage,
    ReadMessage,
    Refusal,
    Registrant,
    Target,
    TopicMessage,
)
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.transport import NoAnswer, ProviderAnswer
from testkit.fakes.matrix_gateway import (
    GATEWAY_HOST,
    NOTIFY_PATH,
    FakeMatrixGateway,
    GatewayAnswer,
)

PUSHKEY = "pushkey-of-the-phone"
HINT = PushMessage(
    nid="0190c0de-0000-7000-8000-000000000007",
    kind="message",
    count=2,
    quiet=False,
    thread_id="t1",
    message_id="m9",
    badge=3,
    urgency="normal",
)


@pytest.fixture
async def gateway(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[FakeMatrixGateway]:
    fake = FakeMatrixGateway(ca=ca)
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the relay broke the Push Gateway API"


def relay(
    clock: FakeClock,
    ca_file: str,
    *,
    allowed: tuple[str, ...] = (GATEWAY_HOST,),
    private: bool = True,
    resolver: FakeResolver | None = None,
) -> MatrixRelayProvider:
    return MatrixRelayProvider(
        allowed_gateways=allowed,
        allow_private_addresses=private,
        clock=clock,
        resolver=resolver or FakeResolver({GATEWAY_HOST: ["127.0.0.1"]}),
        ca_file=ca_file,
    )


def target(gateway: FakeMatrixGateway, **extra: Any) -> Target:
    found = registrant({"token": PUSHKEY, "gateway": gateway.url, "app_id": "im.vendor.ios"})
    assert isinstance(found, Registrant)
    return Target(
        registration_id="r1",
        user_id="alex",
        provider="matrix",
        token=found.token,
        platform="ios",
        app_id="im.vendor.ios",
        signing_key=found.secret,
        **extra,
    )


async def test_a_hint_becomes_a_content_free_notify_request(
    gateway: FakeMatrixGateway, ca_file: str, clock: FakeClock
) -> None:
    sender = relay(clock, ca_file)
    outcome = await sender.send(target(gateway), HINT)
    await sender.aclose()
    assert outcome.kind is OutcomeKind.DELIVERED
    assert gateway.notifications() == [
        {
            "event_id": HINT.nid,
            "room_id": "t1",
            "counts": {"unread": 3},
            "prio": "high",
            "devices": [
                {
                    "app_id": "im.vendor.ios",
                    "pushkey": PUSHKEY,
                    "data": {"format": "event_id_only"},
                }
            ],
        }
    ]
    assert gateway.headers[0]["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            PushMessage(nid="n1", kind="summary", count=1, quiet=True, urgency="low"),
            {"event_id": "n1", "prio": "low"},
        ),
        (
            ReadMessage(thread_id="t1", seq=4, badge=0, urgency="low"),
            {"counts": {"unread": 0}, "prio": "low"},
        ),
        (
            MatrixMessage("$e:hs", "!r:hs", unread=2, missed_calls=1, urgency="normal"),
            {
                "event_id": "$e:hs",
                "room_id": "!r:hs",
                "counts": {"unread": 2, "missed_calls": 1},
                "prio": "high",
            },
        ),
    ],
)
async def test_each_message_is_its_notification(
    gateway: FakeMatrixGateway,
    ca_file: str,
    clock: FakeClock,
    message: Any,
    expected: dict[str, Any],
) -> None:
    sender = relay(clock, ca_file)
    assert (await sender.send(target(gateway), message)).kind is OutcomeKind.DELIVERED
    await sender.aclose()
    (sent,) = gateway.notifications()
    sent.pop("devices")
    assert sent == expected


async def test_a_pushkey_the_gateway_rejects_is_dead(
    gateway: FakeMatrixGateway, ca_file: str, clock: FakeClock
) -> None:
    sender = relay(clock, ca_file)
    gateway.reject("another-pushkey")
    assert (await sender.send(target(gateway), HINT)).kind is OutcomeKind.DELIVERED
    gateway.reject(PUSHKEY)
    assert await sender.send(target(gateway), HINT) == Outcome.dead("pushkey_rejected")
    await sender.aclose()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            GatewayAnswer(429, (("retry-after", "30"),)),
            Outcome.transient("http_429", timedelta(seconds=30)),
        ),
        (GatewayAnswer(502), Outcome.transient("http_502", timedelta(seconds=1))),
        (GatewayAnswer(404), Outcome.rejected("http_404")),
        (GatewayAnswer(400), Outcome.rejected("http_400")),
        (
            GatewayAnswer(302, (("location", f"https://{GATEWAY_HOST}/elsewhere"),)),
            Outcome.rejected("redirect"),
        ),
    ],
)
async def test_each_gateway_answer_becomes_its_outcome(
    gateway: FakeMatrixGateway,
    ca_file: str,
    clock: FakeClock,
    answer: GatewayAnswer,
    expected: Outcome,
) -> None:
    sender = relay(clock, ca_file)
    gateway.script.append(answer)
    assert await sender.send(target(gateway), HINT) == expected
    await sender.aclose()
    assert len(gateway.requests) == 1  # a redirect is never followed


def test_no_answer_is_transient_and_ours_and_a_2xx_without_the_pushkey_delivered() -> None:
    assert matrix_outcome(NoAnswer("timeout"), PUSHKEY) == Outcome.transient(
        "timeout", timedelta(seconds=1), ours=True
    )
    unreadable = ProviderAnswer(200, (), b"not json")
    assert matrix_outcome(unreadable, PUSHKEY) == Outcome.delivered()
    odd = ProviderAnswer(200, (), b'{"rejected": "pushkey-of-the-phone"}')
    assert matrix_outcome(odd, PUSHKEY) == Outcome.delivered()


async def test_a_topic_push_is_never_relayed(
    gateway: FakeMatrixGateway, ca_file: str, clock: FakeClock
) -> None:
    sender = relay(clock, ca_file)
    message = TopicMessage(topic=b"t" * 32, sequence_id=1, recipient_id=b"r" * 32)
    assert await sender.send(target(gateway), message) == Outcome.rejected("not_relayed")
    await sender.aclose()
    assert gateway.requests == []


async def test_a_gateway_no_longer_allowed_is_not_contacted(
    gateway: FakeMatrixGateway, ca_file: str, clock: FakeClock
) -> None:
    sender = relay(clock, ca_file, allowed=("push.other.test",))
    outcome = await sender.send(target(gateway), HINT)
    await sender.aclose()
    assert outcome == Outcome.rejected("gateway_not_allowed")
    assert gateway.requests == []


async def test_a_gateway_on_a_private_address_is_refused_unless_allowed(
    gateway: FakeMatrixGateway, ca_file: str, clock: FakeClock
) -> None:
    sender = relay(clock, ca_file, private=False)
    assert await sender.send(target(gateway), HINT) == Outcome.rejected("private_address")
    assert await sender.check_registration(PUSHKEY, gateway.url) == (
        "gateway",
        "the host resolves to a private or local address",
    )
    await sender.aclose()
    assert gateway.requests == []


async def test_a_registration_is_checked_against_the_allowed_gateways(
    ca_file: str, clock: FakeClock
) -> None:
    sender = relay(
        clock,
        ca_file,
        allowed=("*.vendor.test",),
        private=False,
        resolver=FakeResolver({GATEWAY_HOST: ["203.0.113.9"], "push.other.test": ["8.8.8.8"]}),
    )
    url = f"https://{GATEWAY_HOST}{NOTIFY_PATH}"
    assert await sender.check_registration(PUSHKEY, url) == (
        "gateway",
        "the host resolves to a private or local address",
    )  # 203.0.113.0/24 is documentation space, not globally reachable
    other = f"https://push.other.test{NOTIFY_PATH}"
    assert await sender.check_registration(PUSHKEY, other) == (
        "gateway",
        "the host is not in push.matrix.allowed_gateways",
    )
    await sender.aclose()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gateway": "https://g.test/_matrix/push/v1/notify", "app_id": "a"}, "token"),
        ({"token": "k" * 513, "gateway": "https://g.test/_matrix/push/v1/notify"}, "token"),
        ({"token": "k k", "gateway": "https://g.test/_matrix/push/v1/notify"}, "token"),
        ({"token": "k", "app_id": "a"}, "gateway"),
        (
            {"token": "k", "gateway": "http://g.test/_matrix/push/v1/notify", "app_id": "a"},
            "gateway",
        ),
        ({"token": "k", "gateway": "https://g.test/notify", "app_id": "a"}, "gateway"),
        (
            {"token": "k", "gateway": "https://u:p@g.test/_matrix/push/v1/notify", "app_id": "a"},
            "gateway",
        ),
        ({"token": "k", "gateway": "https://g.test/_matrix/push/v1/notify"}, "app_id"),
    ],
)
def test_a_bad_relay_registration_is_refused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    found = registrant(body)
    assert isinstance(found, Refusal)
    assert found.field == field


def test_a_relay_registration_stores_the_pushkey_and_the_gateway_in_one_spelling() -> None:
    found = registrant(
        {
            "token": "k1",
            "gateway": "https://Push.Vendor.TEST:443/_matrix/push/v1/notify",
            "app_id": "a",
        }
    )
    assert found == Registrant("k1", secret="https://push.vendor.test/_matrix/push/v1/notify")
    assert "k1" not in repr(found) and "vendor" not in repr(found)


def test_a_bad_allowed_gateway_pattern_fails_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"push\.matrix\.allowed_gateways"):
        prepare(MatrixRelayConfig(allowed_gateways=("*.com.",)), "push.matrix")
    prepare(
        MatrixRelayConfig(allowed_gateways=("push.vendor.test", "*.vendor.test")), "push.matrix"
    )
