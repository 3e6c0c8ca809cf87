"""The webhook provider against a TLS receiver that verifies with ``standardwebhooks``."""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from functools import partial

import pytest
import trio
import trustme

from bothy_notify.config import ConfigError, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.port import OutcomeKind, PushMessage, Target, TopicMessage
from bothy_notify.push.providers import build as build_providers
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webhook import WebhookProvider, sign
from testkit.fakes.webhook import HOST, SIGNING_KEY, WebhookReceiver

PUBLIC = "93.184.216.34"
MESSAGE = PushMessage(
    nid="0190c0de-0000-7000-8000-000000000003",
    kind="message",
    count=1,
    quiet=False,
    thread_id="t1",
    message_id="m1",
)


@pytest.fixture
async def receiver(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver(ca=ca)
    await nursery.start(hooks.serve)
    yield hooks


def target(
    url: str,
    *,
    key: str = SIGNING_KEY,
    attempt: int = 1,
    max_attempts: int = 3,
    last_error: str | None = None,
    failure_count: int = 0,
) -> Target:
    return Target(
        registration_id="reg-3",
        user_id="robot",
        provider="webhook",
        token=url,
        platform="web",
        signing_key=key,
        attempt=attempt,
        max_attempts=max_attempts,
        last_error=last_error,
        failure_count=failure_count,
    )


def webhook(
    resolver: FakeResolver,
    clock: FakeClock,
    ca_file: str,
    *,
    private: bool = True,
    domains: tuple[str, ...] = (HOST,),
    bound: float = 10.0,
    proxy: str = "",
) -> WebhookProvider:
    return WebhookProvider(
        allowed_domains=domains,
        allow_private_addresses=private,
        resolver=resolver,
        clock=clock,
        ca_file=ca_file,
        proxy=proxy,
        request_bound=bound,
    )


async def test_a_2xx_is_delivered_with_a_signature_standardwebhooks_accepts(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    outcome = await provider.send(target(receiver.url()), MESSAGE)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (delivery,) = receiver.deliveries
    assert delivery.verified
    assert delivery.headers["webhook-id"] == MESSAGE.nid
    assert delivery.headers["content-type"] == "application/json"
    assert delivery.body == {**MESSAGE.payload(), "user_id": "robot", "registration_id": "reg-3"}


async def test_the_connection_goes_to_the_checked_address_with_the_urls_host(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    # hooks.bothy.test exists only in the fake resolver: reaching the receiver proves
    # the connection went to the address that was checked, with TLS verified for the
    # URL's host and the Host header naming it.
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    provider = webhook(resolver, now_clock, ca_file)
    outcome = await provider.send(target(receiver.url("/a?x=1")), MESSAGE)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    assert receiver.deliveries[0].host == f"{HOST}:{receiver.port}"
    assert receiver.deliveries[0].path == "/a"
    assert resolver.lookups == 1


async def test_a_raw_base64_signing_key_works_like_a_whsec_one(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    await provider.send(target(receiver.url(), key=SIGNING_KEY.removeprefix("whsec_")), MESSAGE)
    await provider.aclose()
    assert receiver.deliveries[0].verified


def test_the_signature_is_hmac_sha256_of_id_timestamp_and_body() -> None:
    import hashlib
    import hmac

    key = b"k" * 16
    expected = hmac.new(key, b"msg_1.1700000000.{}", hashlib.sha256).digest()
    assert sign(key, "msg_1", 1_700_000_000, b"{}") == "v1," + base64.b64encode(expected).decode()


@pytest.mark.parametrize(
    ("status", "kind", "reason"),
    [
        (204, OutcomeKind.DELIVERED, ""),
        (302, OutcomeKind.REJECTED, "redirect"),
        (400, OutcomeKind.REJECTED, "http_400"),
        (403, OutcomeKind.REJECTED, "http_403"),
        (429, OutcomeKind.REJECTED, "http_429"),
        (500, OutcomeKind.TRANSIENT, "http_500"),
        (503, OutcomeKind.TRANSIENT, "http_503"),
        (404, OutcomeKind.TRANSIENT, "http_404"),
        (410, OutcomeKind.TRANSIENT, "http_410"),
    ],
)
async def test_each_receiver_answer_becomes_its_outcome(
    receiver: WebhookReceiver,
    ca_file: str,
    now_clock: FakeClock,
    status: int,
    kind: OutcomeKind,
    reason: str,
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    receiver.answer("/hook", status)
    outcome = await provider.send(target(receiver.url()), MESSAGE)
    await provider.aclose()

    assert (outcome.kind, outcome.reason) == (kind, reason)
    assert [d.path for d in receiver.deliveries] == ["/hook"]  # a redirect is not followed


@pytest.mark.parametrize("status", [404, 410])
async def test_gone_on_the_last_attempt_after_gone_on_every_one_is_dead(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock, status: int
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    receiver.answer("/hook", status)
    streak = target(
        receiver.url(), attempt=3, max_attempts=3, last_error=f"http_{status}", failure_count=2
    )
    outcome = await provider.send(streak, MESSAGE)
    await provider.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.DEAD, f"http_{status}")


async def test_gone_on_the_last_attempt_after_another_error_is_not_dead(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    receiver.answer("/hook", 404)
    broken = target(
        receiver.url(), attempt=3, max_attempts=3, last_error="http_500", failure_count=2
    )
    outcome = await provider.send(broken, MESSAGE)
    await provider.aclose()
    assert outcome.kind is OutcomeKind.TRANSIENT


async def test_a_single_attempt_send_answered_gone_is_dead(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    receiver.answer("/hook", 410)
    outcome = await provider.send(target(receiver.url(), max_attempts=1), MESSAGE)
    await provider.aclose()
    assert outcome.kind is OutcomeKind.DEAD


async def test_a_host_that_never_answers_is_transient_timeout(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    receiver.stall_paths.add("/slow")
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file, bound=0.3)
    outcome = await provider.send(target(receiver.url("/slow")), MESSAGE)
    await provider.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "timeout")


async def test_a_refused_connection_and_a_failed_lookup_are_transient(
    ca_file: str, now_clock: FakeClock
) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        provider = webhook(
            FakeResolver({HOST: ["127.0.0.1"]}),
            now_clock,
            ca_file,
            domains=(HOST, "nowhere.bothy.test"),
        )
        refused = await provider.send(target(f"https://{HOST}:{port}/hook"), MESSAGE)
        unknown = await provider.send(target("https://nowhere.bothy.test/hook"), MESSAGE)
        await provider.aclose()
    assert (refused.kind, refused.reason) == (OutcomeKind.TRANSIENT, "connect_error")
    assert (unknown.kind, unknown.reason) == (OutcomeKind.TRANSIENT, "dns_error")


async def test_a_host_that_now_resolves_to_loopback_is_refused_at_send(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: [PUBLIC]})
    provider = webhook(resolver, now_clock, ca_file, private=False)
    assert await provider.check_registration(receiver.url()) is None
    resolver.set(HOST, "127.0.0.1")  # DNS changes after registration
    outcome = await provider.send(target(receiver.url()), MESSAGE)
    await provider.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "private_address")
    assert receiver.deliveries == []


async def test_one_private_address_among_public_ones_refuses_the_send(
    ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(
        FakeResolver({HOST: [PUBLIC, "169.254.169.254"]}), now_clock, ca_file, private=False
    )
    outcome = await provider.send(target(f"https://{HOST}/hook"), MESSAGE)
    await provider.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "private_address")


@pytest.mark.parametrize(
    ("url", "table", "problem"),
    [
        (
            f"https://{HOST}/h",
            {HOST: ["127.0.0.1"]},
            "the host resolves to a private or local address",
        ),
        (
            f"https://{HOST}/h",
            {HOST: ["::ffff:10.0.0.1"]},
            "the host resolves to a private or local address",
        ),
        (f"https://{HOST}/h", {}, "the host could not be resolved"),
        (
            "https://evil.example/h",
            {"evil.example": [PUBLIC]},
            "the host is not in push.webhook.allowed_domains",
        ),
        ("http://hooks.bothy.test/h", {HOST: [PUBLIC]}, "expected an https URL"),
        (f"https://{HOST}/h", {HOST: [PUBLIC]}, None),
        ("https://A.Apps.Example.ORG/h", {"a.apps.example.org": [PUBLIC]}, None),
        (
            "https://example.org/h",
            {"example.org": [PUBLIC]},
            "the host is not in push.webhook.allowed_domains",
        ),
    ],
)
async def test_registration_checks_domain_and_resolved_addresses(
    ca_file: str, now_clock: FakeClock, url: str, table: dict[str, list[str]], problem: str | None
) -> None:
    provider = webhook(
        FakeResolver(table), now_clock, ca_file, private=False, domains=(HOST, "*.example.org")
    )
    found = await provider.check_registration(url)
    await provider.aclose()
    assert found == (None if problem is None else ("token", problem))


async def test_an_egress_proxy_is_asked_for_the_checked_address(
    nursery: trio.Nursery, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    asked: list[bytes] = []

    async def proxy(client: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await client.receive_some(4096)
        line = head.split(b"\r\n", 1)[0]
        asked.append(line)
        host, port = line.split(b" ")[1].rsplit(b":", 1)
        upstream = await trio.open_tcp_stream(host.decode().strip("[]"), int(port))
        await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(a: trio.abc.Stream, b: trio.abc.Stream) -> None:
            try:
                while data := await a.receive_some(65536):
                    await b.send_all(data)
            except trio.BrokenResourceError:
                pass
            finally:
                await b.aclose()

        async with trio.open_nursery() as inner:
            inner.start_soon(pipe, client, upstream)
            inner.start_soon(pipe, upstream, client)

    (listener,) = await nursery.start(partial(trio.serve_tcp, proxy, 0, host="127.0.0.1"))
    proxy_url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file, proxy=proxy_url)
    outcome = await provider.send(target(receiver.url()), MESSAGE)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    assert asked == [f"CONNECT 127.0.0.1:{receiver.port} HTTP/1.1".encode()]
    assert receiver.deliveries[0].verified


def test_a_proxy_endpoint_that_is_not_a_url_fails_startup() -> None:
    config = structure_config(
        {"push": {"webhook": {"allowed_domains": [HOST], "endpoint": "ftp://proxy"}}}, env={}
    )
    with pytest.raises(ConfigError, match=r"push\.webhook\.endpoint"):
        build_providers(config.push, dev=False)


async def test_a_webhook_without_a_usable_signing_key_is_rejected_unsent(
    receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    provider = webhook(FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file)
    outcome = await provider.send(target(receiver.url(), key="short"), MESSAGE)
    await provider.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "bad_signing_key")
    assert receiver.deliveries == []


async def test_a_host_no_longer_allowed_is_not_contacted_and_logged_once_a_minute(
    receiver: WebhookReceiver,
    ca_file: str,
    now_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Registered while the host was allowed; the configuration has changed since.
    provider = webhook(
        FakeResolver({HOST: ["127.0.0.1"]}), now_clock, ca_file, domains=("other.bothy.test",)
    )
    topic = TopicMessage(topic=b"\x00" + b"t" * 16, sequence_id=9, recipient_id=b"r" * 32)
    with caplog.at_level(logging.WARNING, logger="bothy.push.webhook"):
        person = await provider.send(target(receiver.url()), MESSAGE)
        topic_mode = await provider.send(target(receiver.url()), topic)
    await provider.aclose()

    for outcome in (person, topic_mode):
        assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "domain_not_allowed")
    assert receiver.deliveries == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert "push.webhook.allowed_domains" in line and HOST not in line
