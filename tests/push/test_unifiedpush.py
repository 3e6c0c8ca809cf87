"""UnifiedPush: an Android app without Google's services registers its distributor's
endpoint as a Web Push registration, and the daemon pushes to it as UnifiedPush asks
(AND_3.0 on the phone, the server specification's rules at the push server).

The fake distributor (:mod:`testkit.fakes.distributor`) is a real HTTPS server
that decrypts every push with the app's keys and refuses what UnifiedPush refuses:
no ``TTL`` or ``Urgency``, a body over 4,096 bytes, a body that is not
``aes128gcm`` for the app's keys, a VAPID signature of another key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trustme
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.port import Outcome, OutcomeKind, PushMessage, Registrant, Target
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webpush import WebPushProvider, public_key_b64, registrant
from testkit.fakes.distributor import DISTRIBUTOR, FakeDistributor
from testkit.fakes.webpush import Browser, PushAnswer
from tests.harness import Launch, Node, device_token, ev, make_config
from tests.push.test_delivery import message, people

PHONE = device_token("alex", "alex-phone", "android")
TABLET = device_token("alex", "alex-tablet", "android")


@pytest.fixture(scope="module")
def vapid() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
async def distributor(
    nursery: trio.Nursery, ca: trustme.CA, vapid: ec.EllipticCurvePrivateKey
) -> AsyncIterator[FakeDistributor]:
    fake = FakeDistributor(ca=ca, server_key=public_key_b64(vapid))
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the daemon broke a UnifiedPush rule"


async def start(
    launch: Launch,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    clock: FakeClock,
    allowed: tuple[str, ...] = (DISTRIBUTOR,),
) -> Node:
    # The distributor's own host is allowed by push.webpush.allowed_endpoints, as an
    # operator lists ntfy.sh or a self-hosted ntfy beside the browsers' services.
    sender = WebPushProvider(
        key=vapid,
        subject="mailto:ops@bothy.test",
        allowed_endpoints=allowed,
        allow_private_addresses=True,
        clock=clock,
        resolver=FakeResolver({DISTRIBUTOR: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    node = await launch(
        config=make_config(push={"max_attempts": 3}), providers={"webpush": sender}, clock=clock
    )
    await people(node)
    return node


async def register(node: Node, app: Browser, token: str = PHONE) -> int:
    """What the app sends its server once the connector library gave it an endpoint:
    the endpoint and the keys, as a browser's ``PushSubscription.toJSON()``."""
    subscription: dict[str, Any] = {
        "endpoint": app.endpoint,
        "keys": app.subscription()["keys"],
    }
    response = await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "webpush", "subscription": subscription},
        token=token,
    )
    return response.status_code


async def test_the_app_gets_the_content_free_push_with_ttl_and_urgency(
    launch: Launch,
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    app = distributor.register_app("chat")
    assert await register(node, app) == 201

    await node.append(message(1))
    await node.settle()

    (push,) = distributor.delivered_to(app)
    assert push.payload["kind"] == "message" and push.payload["message_id"] == "m1"
    assert push.headers["ttl"] == "3600"  # push.max_age
    assert push.headers["urgency"] == "normal"
    assert push.headers["content-encoding"] == "aes128gcm"


async def test_a_mention_is_sent_with_high_urgency(
    launch: Launch,
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    app = distributor.register_app("chat")
    assert await register(node, app) == 201
    await node.append(
        ev(
            "message.created",
            thread_id="t1",
            message_id="m1",
            thread_seq=1,
            author_id="sam",
            mentions=["alex"],
        )
    )
    await node.settle()
    (push,) = distributor.delivered_to(app)
    assert push.headers["urgency"] == "high"


@pytest.mark.parametrize("status", [404, 410])
async def test_a_gone_endpoint_invalidates_the_registration(
    launch: Launch,
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    status: int,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    app = distributor.register_app("chat")
    assert await register(node, app) == 201
    if status == 410:
        distributor.unregister(app)
    else:
        distributor.answer_app(app, PushAnswer(404))

    await node.append(message(1))
    await node.settle()
    await node.append(message(2))
    await node.settle()

    ((invalidated, error),) = await node.sql(
        "SELECT invalidated_at IS NOT NULL, last_error FROM bothy.push_registrations"
    )
    assert (invalidated, error) == (True, f"http_{status}")
    assert distributor.requests == {"chat": 1}  # never contacted again


async def test_a_429_backs_off_that_endpoint_only_never_its_hosts_others(
    launch: Launch,
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    limited = distributor.register_app("limited")
    other = distributor.register_app("other")
    assert await register(node, limited, PHONE) == 201
    assert await register(node, other, TABLET) == 201
    distributor.answer_app(limited, PushAnswer(429, (("retry-after", "60"),)))

    await node.append(message(1))
    await node.settle()
    # Within the minute the limited endpoint is not contacted; the other one of the
    # same host is, at once.
    await node.append(message(2))
    await node.settle()
    assert distributor.requests == {"limited": 1, "other": 2}
    assert len(distributor.delivered_to(other)) == 2
    assert distributor.delivered_to(limited) == []

    await node.advance(61)
    await node.advance(30)  # the second hint's retry, backed off behind the first's
    assert {p.payload["message_id"] for p in distributor.delivered_to(limited)} == {"m1", "m2"}
    ((invalidated, strikes),) = await node.sql(
        "SELECT invalidated_at IS NOT NULL, failure_count FROM bothy.push_registrations"
        " WHERE device_id = 'alex-phone'"
    )
    assert (invalidated, strikes) == (False, 0)


async def test_an_endpoint_of_a_distributor_not_allowed_is_refused_at_registration(
    launch: Launch,
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock, allowed=("ntfy.sh",))
    app = distributor.register_app("chat")
    assert await register(node, app) == 422
    assert distributor.requests == {}


async def test_a_body_over_4096_bytes_is_never_sent(
    distributor: FakeDistributor,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    # IDs are at most 128 characters, so no hint comes near it; a message that
    # would is refused here rather than by the distributor (413).
    sender = WebPushProvider(
        key=vapid,
        subject="mailto:ops@bothy.test",
        allowed_endpoints=(DISTRIBUTOR,),
        allow_private_addresses=True,
        clock=now_clock,
        resolver=FakeResolver({DISTRIBUTOR: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    app = distributor.register_app("chat")
    found = registrant({"subscription": app.subscription()})
    assert isinstance(found, Registrant)
    target = Target("r1", "alex", "webpush", found.token, "android", signing_key=found.secret)
    small = PushMessage(nid="n1", kind="message", count=1, quiet=False, thread_id="t1")
    large = PushMessage(nid="n2", kind="message", count=1, quiet=False, thread_id="t" * 4000)
    assert (await sender.send(target, small)).kind is OutcomeKind.DELIVERED
    assert await sender.send(target, large) == Outcome.rejected("too_large")
    await sender.aclose()
    assert distributor.requests == {"chat": 1}
