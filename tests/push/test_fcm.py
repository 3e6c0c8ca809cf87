"""The FCM provider against a fake FCM with its OAuth2 token endpoint (SPEC section 10)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import timedelta

import pytest
import trio
import trustme
from cryptography.hazmat.primitives.asymmetric import rsa

from bothy_notify.config import ConfigError, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.fcm import (
    FcmProvider,
    StaticAccessTokens,
    TokenRefused,
    TokenUnavailable,
    fcm_outcome,
    token_from_answer,
)
from bothy_notify.push.port import (
    OutcomeKind,
    PushMessage,
    ReadMessage,
    SummaryMessage,
    Target,
)
from bothy_notify.push.transport import NoAnswer, ProviderAnswer
from testkit.fakes.fcm import PROJECT, FakeFcm, FcmAnswer, error_body

TOKEN = "fcm-registration-token-1"
MESSAGE = PushMessage(
    nid="0190c0de-0000-7000-8000-000000000002",
    kind="mention",
    count=3,
    quiet=True,
    thread_id="t1",
    message_id="m9",
)


def target(token: str = TOKEN, platform: str = "android") -> Target:
    return Target(
        registration_id="reg-2", user_id="sam", provider="fcm", token=token, platform=platform
    )


def fcm(fake: FakeFcm, ca_file: str, clock: FakeClock, token_uri: str | None = None) -> FcmProvider:
    config = structure_config(
        {
            "push": {
                "fcm": {"service_account": "env:FCM_SA", "endpoint": fake.url, "ca_file": ca_file}
            }
        },
        env={"FCM_SA": fake.service_account(token_uri)},
    )
    assert config.push.fcm is not None
    return FcmProvider.from_config(config.push.fcm, clock=clock)


async def test_200_is_delivered_as_a_data_only_message_of_strings(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    outcome = await provider.send(target(platform="ios"), MESSAGE)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (request,) = fake_fcm.requests
    assert request.project == PROJECT
    assert request.authorization == "Bearer ya29.fake-1"
    message = request.body["message"]
    assert message["data"] == {
        "nid": MESSAGE.nid,
        "kind": "mention",
        "thread_id": "t1",
        "message_id": "m9",
        "count": "3",
        "quiet": "true",
    }
    assert message["android"] == {"priority": "HIGH"}
    assert message["apns"]["headers"] == {"apns-priority": "5", "apns-push-type": "background"}
    assert "notification" not in message


@pytest.mark.parametrize(
    ("message", "priority"),
    [
        (replace(MESSAGE, urgency="high", badge=4), "HIGH"),
        (replace(MESSAGE, urgency="normal", badge=4), "HIGH"),
        (replace(MESSAGE, urgency="low", badge=4), "NORMAL"),
        (ReadMessage(thread_id="t1", seq=5, badge=4, urgency="low"), "NORMAL"),
        (SummaryMessage(nid=MESSAGE.nid, count=2, badge=4, urgency="low"), "NORMAL"),
    ],
)
async def test_the_urgency_sets_android_priority_and_travels_as_data_with_the_badge(
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    message: PushMessage | ReadMessage | SummaryMessage,
    priority: str,
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    await provider.send(target(), message)
    await provider.aclose()

    (request,) = fake_fcm.requests
    sent = request.body["message"]
    assert sent["android"] == {"priority": priority}
    assert sent["data"]["badge"] == "4"
    assert sent["data"]["urgency"] == message.urgency
    assert all(isinstance(v, str) for v in sent["data"].values())


BROKEN = b"<html>upstream gone"

ROWS = [
    # quota failures: transient, at least 60 s, and they win over every other detail
    (FcmAnswer(429), OutcomeKind.TRANSIENT, "http_429", 60),
    (FcmAnswer(429, error_body(429, "RESOURCE_EXHAUSTED")), OutcomeKind.TRANSIENT, "http_429", 60),
    (
        FcmAnswer(429, error_body(429, "RESOURCE_EXHAUSTED", fcm="QUOTA_EXCEEDED")),
        OutcomeKind.TRANSIENT,
        "QUOTA_EXCEEDED",
        60,
    ),
    (
        FcmAnswer(400, error_body(400, "RESOURCE_EXHAUSTED", quota=True)),
        OutcomeKind.TRANSIENT,
        "QUOTA_EXCEEDED",
        60,
    ),
    (
        FcmAnswer(429, error_body(429, "NOT_FOUND", fcm="UNREGISTERED")),
        OutcomeKind.TRANSIENT,
        "http_429",
        60,
    ),
    # 500 and 503: transient even with an absent or broken body, over any detail
    (FcmAnswer(500), OutcomeKind.TRANSIENT, "http_500", 10),
    (FcmAnswer(503, BROKEN), OutcomeKind.TRANSIENT, "http_503", 10),
    (
        FcmAnswer(503, error_body(503, "UNAVAILABLE", fcm="UNREGISTERED")),
        OutcomeKind.TRANSIENT,
        "http_503",
        10,
    ),
    (
        FcmAnswer(500, error_body(500, "INTERNAL", fcm="SENDER_ID_MISMATCH")),
        OutcomeKind.TRANSIENT,
        "http_500",
        10,
    ),
    # typed details
    (
        FcmAnswer(404, error_body(404, "NOT_FOUND", fcm="UNREGISTERED")),
        OutcomeKind.DEAD,
        "UNREGISTERED",
        None,
    ),
    (
        FcmAnswer(403, error_body(403, "PERMISSION_DENIED", fcm="SENDER_ID_MISMATCH")),
        OutcomeKind.MISMATCH,
        "SENDER_ID_MISMATCH",
        None,
    ),
    (
        FcmAnswer(400, error_body(400, "UNAVAILABLE", fcm="UNAVAILABLE")),
        OutcomeKind.TRANSIENT,
        "UNAVAILABLE",
        10,
    ),
    (
        FcmAnswer(400, error_body(400, "INTERNAL", fcm="INTERNAL")),
        OutcomeKind.TRANSIENT,
        "INTERNAL",
        10,
    ),
    # everything else is rejected, never dead
    (
        FcmAnswer(400, error_body(400, "INVALID_ARGUMENT", fcm="INVALID_ARGUMENT")),
        OutcomeKind.REJECTED,
        "INVALID_ARGUMENT",
        None,
    ),
    (
        FcmAnswer(403, error_body(403, "PERMISSION_DENIED", fcm="THIRD_PARTY_AUTH_ERROR")),
        OutcomeKind.REJECTED,
        "THIRD_PARTY_AUTH_ERROR",
        None,
    ),
    (FcmAnswer(404, error_body(404, "NOT_FOUND")), OutcomeKind.REJECTED, "NOT_FOUND", None),
    (FcmAnswer(400, BROKEN), OutcomeKind.REJECTED, "http_400", None),
    (FcmAnswer(418), OutcomeKind.REJECTED, "http_418", None),
]


@pytest.mark.parametrize(("answer", "kind", "reason", "minimum"), ROWS)
async def test_each_fcm_answer_becomes_its_outcome(
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    answer: FcmAnswer,
    kind: OutcomeKind,
    reason: str,
    minimum: int | None,
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    fake_fcm.answer(TOKEN, answer)
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()

    assert (outcome.kind, outcome.reason) == (kind, reason)
    expected = None if minimum is None else timedelta(seconds=minimum)
    assert outcome.retry_after == expected


@pytest.mark.parametrize(
    ("status", "retry_after", "waits"),
    [
        (503, "120", 120),
        (503, "900", 300),
        (503, "3", 10),
        (503, "soon", 10),
        (429, "30", 60),
        (429, "240", 240),
    ],
)
async def test_a_longer_retry_after_is_honoured_up_to_300_seconds(
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    status: int,
    retry_after: str,
    waits: int,
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    fake_fcm.answer(TOKEN, FcmAnswer(status, b"", (("retry-after", retry_after),)))
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()
    assert outcome.retry_after == timedelta(seconds=waits)


def test_a_retry_after_http_date_counts_from_the_clock() -> None:
    clock = FakeClock()
    when = (clock.now() + timedelta(seconds=200)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    from bothy_notify.push.transport import parse_retry_after

    assert parse_retry_after(when, clock.now()) == timedelta(seconds=200)
    assert fcm_outcome(503, b"", timedelta(seconds=200)).retry_after == timedelta(seconds=200)


async def test_the_access_token_is_cached_and_replaced_before_it_expires(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    for _ in range(3):
        await provider.send(target(), MESSAGE)
    now_clock.advance(timedelta(minutes=54))
    await provider.send(target(), MESSAGE)
    assert fake_fcm.token_fetches == 1
    now_clock.advance(timedelta(minutes=2))  # 56 min: within 5 min of the hour's expiry
    await provider.send(target(), MESSAGE)
    await provider.aclose()

    assert fake_fcm.token_fetches == 2
    assert fake_fcm.requests[-1].authorization == "Bearer ya29.fake-2"


async def test_an_unreachable_token_endpoint_is_transient(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        closed = f"https://127.0.0.1:{sock.getsockname()[1]}/token"
        provider = fcm(fake_fcm, ca_file, now_clock, token_uri=closed)
        outcome = await provider.send(target(), MESSAGE)
        await provider.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "token_unavailable")
    assert outcome.retry_after == timedelta(seconds=10)
    assert fake_fcm.requests == []


async def test_a_token_endpoint_that_refuses_the_account_rejects_without_sending(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    fake_fcm.token_answers.append(
        FcmAnswer(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
    )
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "token_refused")
    assert fake_fcm.requests == []


ECHO = "echoed-by-the-endpoint"
"""A marker the token endpoint's answers carry: no outcome or log may repeat it."""


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (FcmAnswer(500, {"error": "internal", "error_description": ECHO}), "token_unavailable"),
        (FcmAnswer(503, f"<html>{ECHO}</html>".encode()), "token_unavailable"),
        (FcmAnswer(429, {"error": "rate_limited", "error_description": ECHO}), "token_unavailable"),
        (FcmAnswer(400, {"error": "temporarily_unavailable"}), "token_unavailable"),
        (FcmAnswer(200, f"not json {ECHO}".encode()), "token_unavailable"),
        (FcmAnswer(200, {"token_type": "Bearer", "note": ECHO}), "token_unavailable"),
        (
            FcmAnswer(401, {"error": "unauthorized_client", "error_description": ECHO}),
            "token_refused",
        ),
        (FcmAnswer(403, f"{ECHO}".encode()), "token_refused"),
    ],
)
async def test_a_failed_token_exchange_becomes_its_outcome_and_repeats_nothing_of_it(
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    answer: FcmAnswer,
    reason: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = fcm(fake_fcm, ca_file, now_clock)
    fake_fcm.token_answers.append(answer)
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()

    kind = OutcomeKind.REJECTED if reason == "token_refused" else OutcomeKind.TRANSIENT
    assert (outcome.kind, outcome.reason) == (kind, reason)
    assert outcome.ours or kind is OutcomeKind.REJECTED  # never a strike on the registration
    assert fake_fcm.token_fetches == 1 and fake_fcm.requests == []
    account = json.loads(fake_fcm.service_account())
    key_line = account["private_key"].splitlines()[1]
    said = caplog.text + repr(outcome) + str(outcome.reason) + repr(provider.tokens)
    for secret in (ECHO, key_line, account["client_email"]):
        assert secret not in said


def test_the_token_endpoints_answer_becomes_a_token_or_a_constant_error() -> None:
    assert token_from_answer(ProviderAnswer(200, (), b'{"access_token":"t","expires_in":60}')) == (
        "t",
        timedelta(seconds=60),
    )
    assert token_from_answer(ProviderAnswer(200, (), b'{"access_token":"t"}')) == (
        "t",
        timedelta(hours=1),
    )
    for answer in (NoAnswer("tls_error"), ProviderAnswer(502, (), ECHO.encode())):
        with pytest.raises(TokenUnavailable) as unavailable:
            token_from_answer(answer)
        assert ECHO not in str(unavailable.value) and unavailable.value.__cause__ is None
    with pytest.raises(TokenRefused) as refused:
        token_from_answer(
            ProviderAnswer(400, (), b'{"error":"invalid_grant","x":"%s"}' % ECHO.encode())
        )
    assert ECHO not in str(refused.value) and refused.value.__cause__ is None


async def test_a_refused_access_token_is_replaced_and_the_message_resent_once(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    fake_fcm.answer(TOKEN, FcmAnswer(401, error_body(401, "UNAUTHENTICATED")))
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    assert [r.authorization for r in fake_fcm.requests] == [
        "Bearer ya29.fake-1",
        "Bearer ya29.fake-2",
    ]


async def test_a_second_refused_access_token_is_rejected(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    provider = fcm(fake_fcm, ca_file, now_clock)
    unauthenticated = FcmAnswer(401, error_body(401, "UNAUTHENTICATED"))
    fake_fcm.answer(TOKEN, unauthenticated, unauthenticated)
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "UNAUTHENTICATED")
    assert len(fake_fcm.requests) == 2


def test_no_answer_is_transient_for_at_least_10_seconds_with_its_reason() -> None:
    outcome = fcm_outcome(NoAnswer("connect_error"))
    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "connect_error")
    assert outcome.retry_after == timedelta(seconds=10)


async def test_an_unanswered_send_is_transient_timeout(
    fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    account = json.loads(fake_fcm.service_account())
    provider = FcmProvider(
        project_id=account["project_id"],
        tokens=StaticAccessTokens("ya29.fake-static"),
        clock=now_clock,
        endpoint=fake_fcm.url,
        ca_file=ca_file,
        request_bound=0.3,
    )
    fake_fcm.issued.append("ya29.fake-static")
    fake_fcm.answer(TOKEN, FcmAnswer(stall=True))
    outcome = await provider.send(target(), MESSAGE)
    await provider.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "timeout")


# ---------------------------------------------------------------- startup checks


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"type": "authorized_user"}), "not a service-account JSON"),
        (json.dumps({"type": "service_account", "project_id": "p"}), 'has no "client_email"'),
    ],
)
def test_a_malformed_service_account_fails_startup_naming_the_key(value: str, problem: str) -> None:
    config = structure_config({"push": {"fcm": {"service_account": "env:SA"}}}, env={"SA": value})
    from bothy_notify.push.providers import build as build_providers

    with pytest.raises(ConfigError, match=r"push\.fcm\.service_account") as caught:
        build_providers(config.push, dev=False)
    assert problem in str(caught.value)
    assert value not in str(caught.value)


def test_a_service_account_with_a_broken_private_key_fails_startup(fake_fcm_account: str) -> None:
    info = json.loads(fake_fcm_account)
    info["private_key"] = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    config = structure_config(
        {"push": {"fcm": {"service_account": "env:SA"}}}, env={"SA": json.dumps(info)}
    )
    from bothy_notify.push.providers import build as build_providers

    with pytest.raises(ConfigError, match=r"push\.fcm\.service_account: its private_key"):
        build_providers(config.push, dev=False)


@pytest.fixture
def fake_fcm_account(ca: trustme.CA, fcm_key: rsa.RSAPrivateKey) -> str:
    return FakeFcm(ca=ca, key=fcm_key, port=443).service_account()
