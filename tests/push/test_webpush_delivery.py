"""Web Push inside the daemon: a browser's subscription registered over HTTP (422s
naming the field, an endpoint that never moves between people), pushes through
the runner to the fake push service (decrypted there as the browser would), the
token lifecycle of its answers, expiry, and ``GET /v1/webpush/key``."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import trio
import trustme
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webpush import WebPushProvider, public_key_b64
from testkit.fakes.webpush import HOST, Browser, FakePushService, PushAnswer
from tests.harness import Launch, Node, device_token, make_config
from tests.push.test_delivery import message, people

BROWSER = device_token("alex", "alex-laptop", "web")


@pytest.fixture(scope="module")
def vapid() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
async def service(
    nursery: trio.Nursery, ca: trustme.CA, vapid: ec.EllipticCurvePrivateKey
) -> AsyncIterator[FakePushService]:
    fake = FakePushService(ca=ca, server_key=public_key_b64(vapid))
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == []


async def start(
    launch: Launch, vapid: ec.EllipticCurvePrivateKey, ca_file: str, clock: FakeClock
) -> Node:
    sender = WebPushProvider(
        key=vapid,
        subject="mailto:ops@bothy.test",
        allowed_endpoints=(HOST,),
        allow_private_addresses=True,
        clock=clock,
        resolver=FakeResolver({HOST: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    node = await launch(
        config=make_config(push={"max_attempts": 2}), providers={"webpush": sender}, clock=clock
    )
    await people(node)
    return node


async def subscribe(
    node: Node, browser: Browser, *, token: str = BROWSER, **changes: Any
) -> httpx.Response:
    return await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "webpush", "subscription": {**browser.subscription(), **changes}},
        token=token,
    )


async def row(node: Node) -> dict[str, Any]:
    ((user, invalidated, last_error, strikes),) = await node.sql(
        "SELECT user_id, invalidated_at IS NOT NULL, last_error, failure_count"
        " FROM bothy.push_registrations WHERE provider = 'webpush'"
    )
    return {"user": user, "invalidated": invalidated, "last_error": last_error, "strikes": strikes}


async def test_a_browser_subscription_gets_the_content_free_push_decrypted(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("laptop")
    created = await subscribe(node, browser)
    assert created.status_code == 201, created.text
    assert created.json()["provider"] == "webpush"
    assert "laptop" not in created.text and "keys" not in created.text

    await node.append(message(1))
    await node.settle()

    (push,) = service.delivered()
    assert push.payload["kind"] == "message" and push.payload["message_id"] == "m1"
    assert push.payload["thread_id"] == "t1" and push.payload["count"] == 1
    assert "user_id" not in push.payload  # a browser knows whose it is
    assert (await row(node))["last_error"] is None


@pytest.mark.parametrize(
    ("answer", "invalidated", "last_error"),
    [
        (PushAnswer(410), True, "http_410"),
        (PushAnswer(404), True, "http_404"),
        (PushAnswer(403), False, "http_403"),
        (PushAnswer(413), False, "http_413"),
    ],
)
async def test_the_push_services_answer_decides_the_registration(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    answer: PushAnswer,
    invalidated: bool,
    last_error: str,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("laptop")
    assert (await subscribe(node, browser)).status_code == 201
    service.answer("laptop", answer)
    await node.append(message(1))
    await node.settle()
    assert await row(node) == {
        "user": "alex",
        "invalidated": invalidated,
        "last_error": last_error,
        "strikes": 0,
    }


async def test_a_subscription_past_its_expiration_time_is_invalidated_unsent(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("laptop")
    expires = (now_clock.now() + timedelta(hours=1)).timestamp() * 1000
    assert (await subscribe(node, browser, expirationTime=expires)).status_code == 201
    now_clock.advance(2 * 3600)
    await node.append(message(1))
    await node.settle()
    assert service.pushes == []
    assert await row(node) == {
        "user": "alex",
        "invalidated": True,
        "last_error": "subscription_expired",
        "strikes": 0,
    }


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@pytest.mark.parametrize(
    ("changes", "message_start"),
    [
        ({"endpoint": "http://push.bothy.test/push/x"}, "subscription.endpoint: expected an https"),
        (
            {"endpoint": "https://evil.example/push/x"},
            "subscription.endpoint: the push service's host is not in"
            " push.webpush.allowed_endpoints",
        ),
        (
            {"keys": {"p256dh": b64(b"\x04" + b"\x01" * 64), "auth": b64(b"a" * 16)}},
            "subscription.keys.p256dh: expected the base64url of an uncompressed P-256 point",
        ),
        (
            {"keys": {"p256dh": b64(b"\x04" + b"\x01" * 64)[:20], "auth": b64(b"a" * 16)}},
            "subscription.keys.p256dh",
        ),
        ("short-auth", "subscription.keys.auth: expected the base64url of 16 bytes"),
        ({"expirationTime": "tomorrow"}, "subscription.expirationTime: expected null or"),
        ({"expirationTime": 1000}, "subscription.expirationTime: already past"),
    ],
)
async def test_a_bad_subscription_is_422_naming_the_field_and_stores_nothing(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
    changes: Any,
    message_start: str,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("laptop")
    if changes == "short-auth":
        keys = browser.subscription()["keys"]
        changes = {"keys": {**keys, "auth": b64(b"a" * 15)}}
    response = await subscribe(node, browser, **changes)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"].startswith(message_start)
    assert "laptop" not in response.text and "evil" not in response.text
    assert await node.sql("SELECT 1 FROM bothy.push_registrations") == []


async def test_a_registration_gives_a_subscription_not_a_token(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("laptop")
    response = await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "webpush", "token": browser.endpoint, "subscription": {}},
        token=BROWSER,
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("token: only ")


async def test_an_endpoint_never_moves_between_people(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    browser = service.subscribe("shared-laptop")
    assert (await subscribe(node, browser)).status_code == 201
    sam = device_token("sam", "sam-laptop", "web")

    taken = await subscribe(node, browser, token=sam)
    again = await subscribe(node, browser)

    assert taken.status_code == 409
    assert taken.json()["error"]["code"] == "registration_taken"
    assert "shared-laptop" not in taken.text
    assert again.status_code == 200
    assert (await row(node))["user"] == "alex"


async def test_the_vapid_public_key_is_served_for_the_page(
    launch: Launch,
    service: FakePushService,
    vapid: ec.EllipticCurvePrivateKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    node = await start(launch, vapid, ca_file, now_clock)
    response = await node.request("GET", "/v1/webpush/key")
    assert response.status_code == 200
    assert response.json() == {"public_key": public_key_b64(vapid)}


async def test_without_web_push_the_key_is_404(launch: Launch) -> None:
    node = await launch()
    response = await node.request("GET", "/v1/webpush/key")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_configured"
