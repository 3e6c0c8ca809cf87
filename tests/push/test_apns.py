"""The APNs provider against a fake APNs speaking HTTP/2 over TLS (SPEC section 10)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

import pytest
import trio

from bothy_notify.config import ApnsStyle, ConfigError, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider, apns_outcome
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.port import (
    OutcomeKind,
    PushMessage,
    ReadMessage,
    SummaryMessage,
    Target,
)
from bothy_notify.push.providers import build as build_providers
from bothy_notify.push.transport import NoAnswer
from testkit.fakes.apns import Answer, FakeApns
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

TOKEN = "ab" * 32
GROUP = ThreadGrouping("a-test-grouping-key").of("t1")
MESSAGE = PushMessage(
    nid="0190c0de-0000-7000-8000-000000000001",
    kind="message",
    count=2,
    quiet=False,
    thread_id="t1",
    message_id="m1",
    group=GROUP,
)


def target(token: str = TOKEN, environment: str | None = "production") -> Target:
    return Target(
        registration_id="reg-1",
        user_id="alex",
        provider="apns",
        token=token,
        platform="ios",
        environment=environment,
    )


def provider(
    fake: FakeApns,
    key: ApnsKey,
    ca_file: str,
    clock: FakeClock,
    *,
    style: ApnsStyle = ApnsStyle.BACKGROUND,
    bound: float = 10.0,
    loc: bool = False,
) -> ApnsProvider:
    return ApnsProvider(
        credentials=ApnsCredentials(key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=clock,
        style=style,
        alert_title="New activity",
        title_loc_keys=loc,
        hosts={"production": fake.url, "sandbox": fake.other_url},
        ca_file=ca_file,
        request_bound=bound,
    )


async def test_200_is_delivered_as_a_background_push_with_a_verified_jwt(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    outcome = await apns.send(target(), MESSAGE)
    await apns.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    (request,) = fake_apns.requests
    assert request.path == f"/3/device/{TOKEN}"
    assert request.headers["apns-topic"] == TOPIC
    assert request.headers["apns-push-type"] == "background"
    assert request.headers["apns-priority"] == "5"
    assert request.headers["apns-collapse-id"] == GROUP
    assert request.jwt_header == {"alg": "ES256", "kid": KEY_ID, "typ": "JWT"}
    assert request.jwt_claims["iss"] == TEAM_ID
    assert request.body == {
        "aps": {"content-available": 1},
        "nid": MESSAGE.nid,
        "kind": "message",
        "thread_id": "t1",
        "message_id": "m1",
        "count": 2,
        "quiet": False,
    }


async def test_alert_style_sends_the_generic_title_at_priority_10_with_sound(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, style=ApnsStyle.ALERT)
    await apns.send(target(), MESSAGE)
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "alert"
    assert request.headers["apns-priority"] == "10"
    assert request.headers["apns-collapse-id"] == GROUP
    assert request.body["aps"] == {
        "alert": {"title": "New activity"},
        "mutable-content": 1,
        "interruption-level": "active",
        "sound": "default",
        "thread-id": GROUP,
    }


@pytest.mark.parametrize(
    ("urgency", "level", "priority"),
    [("low", "passive", "5"), ("normal", "active", "10"), ("high", "time-sensitive", "10")],
)
async def test_alert_style_maps_the_kinds_urgency_to_interruption_level_and_priority(
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    urgency: str,
    level: str,
    priority: str,
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, style=ApnsStyle.ALERT)
    await apns.send(target(), replace(MESSAGE, urgency=urgency, badge=3))
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-priority"] == priority
    assert request.body["aps"]["interruption-level"] == level
    assert request.body["aps"]["badge"] == 3
    assert (request.body["urgency"], request.body["badge"]) == (urgency, 3)


async def test_background_style_keeps_priority_5_and_no_level_whatever_the_urgency(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    await apns.send(target(), replace(MESSAGE, urgency="high"))
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-priority"] == "5"
    assert request.body["aps"] == {"content-available": 1}


async def test_title_loc_keys_add_the_kinds_key_beside_the_generic_title(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, style=ApnsStyle.ALERT, loc=True)
    await apns.send(target(), replace(MESSAGE, kind="mention"))
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.body["aps"]["alert"] == {
        "title": "New activity",
        "title-loc-key": "BOTHY_MENTION",
    }


async def test_a_clearing_push_is_background_priority_5_collapsed_on_its_thread_in_any_style(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, style=ApnsStyle.ALERT)
    clear = ReadMessage(thread_id="t1", seq=7, badge=2, urgency="low", group=GROUP)
    await apns.send(target(), clear)
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "background"
    assert request.headers["apns-priority"] == "5"
    assert request.headers["apns-collapse-id"] == GROUP
    assert request.body == {
        "aps": {"content-available": 1},
        "kind": "read",
        "thread_id": "t1",
        "seq": 7,
        "badge": 2,
        "urgency": "low",
    }


async def test_a_summary_is_a_passive_alert_without_sound_in_any_style(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    summary = SummaryMessage(nid=MESSAGE.nid, count=4, badge=5, urgency="low")
    await apns.send(target(), summary)
    await apns.aclose()

    (request,) = fake_apns.requests
    assert request.headers["apns-push-type"] == "alert"
    assert request.headers["apns-priority"] == "5"
    assert "apns-collapse-id" not in request.headers
    assert request.body == {
        "aps": {
            "alert": {"title": "New activity"},
            "mutable-content": 1,
            "interruption-level": "passive",
            "badge": 5,
        },
        "kind": "summary",
        "count": 4,
        "badge": 5,
        "urgency": "low",
    }


async def test_alert_style_is_silent_when_the_hint_is_quiet(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, style=ApnsStyle.ALERT)
    quiet = PushMessage(nid=MESSAGE.nid, kind="message", count=1, quiet=True, thread_id="t1")
    await apns.send(target(), quiet)
    await apns.aclose()

    (request,) = fake_apns.requests
    assert "sound" not in request.body["aps"]
    assert request.body["quiet"] is True


async def test_host_follows_the_registration_environment_over_one_connection_each(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    async with trio.open_nursery() as nursery:
        for i in range(20):
            env = "sandbox" if i % 2 else "production"
            nursery.start_soon(apns.send, target(environment=env), MESSAGE)
    await apns.aclose()

    authorities = {r.authority.split(":")[0] for r in fake_apns.requests}
    assert authorities == {"127.0.0.1", "localhost"}
    sandbox = [r for r in fake_apns.requests if r.authority.startswith("localhost")]
    assert len(sandbox) == 10
    assert fake_apns.connections == 2


async def test_a_registration_without_environment_goes_to_production(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    await apns.send(target(environment=None), MESSAGE)
    await apns.aclose()
    assert fake_apns.requests[0].authority.startswith("127.0.0.1")


@pytest.mark.parametrize(
    ("status", "reason", "kind"),
    [
        (410, "Unregistered", OutcomeKind.DEAD),
        (410, "ExpiredToken", OutcomeKind.DEAD),
        (400, "BadDeviceToken", OutcomeKind.MISMATCH),
        (400, "DeviceTokenNotForTopic", OutcomeKind.MISMATCH),
        (400, "TopicDisallowed", OutcomeKind.MISMATCH),
        (400, "BadCollapseId", OutcomeKind.REJECTED),
        (403, "InvalidProviderToken", OutcomeKind.REJECTED),
        (404, "BadPath", OutcomeKind.REJECTED),
        (405, "MethodNotAllowed", OutcomeKind.REJECTED),
        (413, "PayloadTooLarge", OutcomeKind.REJECTED),
        (429, "TooManyRequests", OutcomeKind.TRANSIENT),
        (500, "InternalServerError", OutcomeKind.TRANSIENT),
        (503, "ServiceUnavailable", OutcomeKind.TRANSIENT),
    ],
)
async def test_each_apns_answer_becomes_its_outcome(
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    status: int,
    reason: str,
    kind: OutcomeKind,
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(TOKEN, Answer(status, reason))
    outcome = await apns.send(target(), MESSAGE)
    await apns.aclose()

    assert outcome.kind is kind
    assert outcome.reason == reason
    if kind is OutcomeKind.TRANSIENT:
        assert outcome.retry_after is not None and outcome.retry_after >= timedelta(seconds=1)


def test_a_410_with_another_reason_and_odd_statuses_are_rejected() -> None:
    assert apns_outcome(410, "SomethingElse").kind is OutcomeKind.REJECTED
    assert apns_outcome(302, "").kind is OutcomeKind.REJECTED
    assert apns_outcome(502, "").kind is OutcomeKind.TRANSIENT
    assert apns_outcome(400, "").reason == "http_400"


def test_no_answer_is_transient_with_its_reason_apart_from_a_5xx() -> None:
    no_answer = apns_outcome(NoAnswer("dns_error"))
    answered = apns_outcome(503, "ServiceUnavailable")
    assert (no_answer.kind, no_answer.reason) == (OutcomeKind.TRANSIENT, "dns_error")
    assert no_answer.retry_after == timedelta(seconds=1)
    assert (answered.kind, answered.reason) == (OutcomeKind.TRANSIENT, "ServiceUnavailable")


async def test_an_unanswered_request_is_transient_timeout(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock, bound=0.3)
    fake_apns.answer(TOKEN, Answer(stall=True))
    outcome = await apns.send(target(), MESSAGE)
    after = await apns.send(target("cd" * 32), MESSAGE)
    await apns.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "timeout")
    assert after.kind is OutcomeKind.DELIVERED  # the connection is still usable


async def test_a_refused_connection_is_transient(
    apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        apns = ApnsProvider(
            credentials=ApnsCredentials(apns_key.private, KEY_ID, TEAM_ID),
            topic=TOPIC,
            clock=now_clock,
            hosts={"production": f"https://127.0.0.1:{port}"},
            ca_file=ca_file,
        )
        outcome = await apns.send(target(), MESSAGE)
        await apns.aclose()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.TRANSIENT, "connect_error")


async def test_expired_provider_token_once_gets_a_new_jwt_and_one_resend(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(TOKEN, Answer(403, "ExpiredProviderToken"))
    outcome = await apns.send(target(), MESSAGE)
    await apns.aclose()

    assert outcome.kind is OutcomeKind.DELIVERED
    first, second = fake_apns.requests
    assert first.authorization != second.authorization
    assert apns.tokens.minted == 2


async def test_expired_provider_token_twice_is_rejected_without_a_third_try(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(
        TOKEN, Answer(403, "ExpiredProviderToken"), Answer(403, "ExpiredProviderToken")
    )
    outcome = await apns.send(target(), MESSAGE)
    await apns.aclose()

    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "ExpiredProviderToken")
    assert len(fake_apns.requests) == 2


async def test_the_provider_jwt_is_reused_for_55_minutes_then_replaced(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    await apns.send(target(), MESSAGE)
    now_clock.advance(timedelta(minutes=54))
    await apns.send(target(), MESSAGE)
    now_clock.advance(timedelta(minutes=2))
    await apns.send(target(), MESSAGE)
    await apns.aclose()

    first, second, third = (r.authorization for r in fake_apns.requests)
    assert first == second != third
    assert apns.tokens.minted == 2


async def test_a_jwt_older_than_an_hour_would_be_refused_by_apns(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    stale = apns.tokens.current()
    now_clock.advance(timedelta(minutes=61))
    # The fake refuses the stale JWT the way Apple does; the provider never sends one.
    assert apns.tokens.current() != stale
    outcome = await apns.send(target(), MESSAGE)
    await apns.aclose()
    assert outcome.kind is OutcomeKind.DELIVERED


async def test_mismatch_log_names_environment_and_topic_and_points_at_the_build(
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(TOKEN, Answer(400, "BadDeviceToken"))
    with caplog.at_level(logging.WARNING, logger="bothy.push.apns"):
        outcome = await apns.send(target(environment="sandbox"), MESSAGE)
    await apns.aclose()

    assert outcome.kind is OutcomeKind.MISMATCH
    (record,) = caplog.records
    text = record.getMessage()
    assert "sandbox" in text and TOPIC in text
    assert "shipped build" in text and "not the device" in text
    assert TOKEN not in text and "reg-1" not in text and "alex" not in text


async def test_a_malformed_device_token_is_rejected_without_a_request(
    fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = provider(fake_apns, apns_key, ca_file, now_clock)
    outcome = await apns.send(target("not-hex/../x"), MESSAGE)
    await apns.aclose()
    assert outcome.kind is OutcomeKind.REJECTED and fake_apns.requests == []


# ---------------------------------------------------------------- startup checks


def apns_config(pem: str, **overrides: str) -> dict[str, object]:
    block = {
        "key": "env:APNS_KEY",
        "key_id": KEY_ID,
        "team_id": TEAM_ID,
        "bundle_id": TOPIC,
        **overrides,
    }
    return {"push": {"apns": block}}


def build(raw: dict[str, object], pem: str) -> None:
    config = structure_config(raw, env={"APNS_KEY": pem})
    build_providers(config.push, dev=False)


def test_a_valid_apns_block_builds_the_provider(apns_key: ApnsKey) -> None:
    config = structure_config(apns_config(apns_key.pem), env={"APNS_KEY": apns_key.pem})
    providers = build_providers(config.push, dev=False)
    assert set(providers) == {"apns"}


def test_a_key_with_escaped_newlines_from_one_env_line_is_accepted(apns_key: ApnsKey) -> None:
    one_line = apns_key.pem.strip().replace("\n", "\\n")
    build(apns_config(one_line), one_line)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"key_id": "short"}, "push.apns.key_id"),
        ({"team_id": "TEAM-12345"}, "push.apns.team_id"),
        ({"bundle_id": "nodots"}, "push.apns.bundle_id"),
        ({"endpoint": "http://plain.example"}, "push.apns.endpoint"),
        ({"ca_file": "/nonexistent/ca.pem"}, "push.apns.ca_file"),
    ],
)
def test_a_malformed_apns_setting_fails_startup_naming_the_key(
    apns_key: ApnsKey, overrides: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as caught:
        build(apns_config(apns_key.pem, **overrides), apns_key.pem)
    assert apns_key.pem.splitlines()[1] not in str(caught.value)


@pytest.mark.parametrize(
    "bad_key",
    [
        "not a key at all",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        " ",
    ],
)
def test_a_malformed_apns_key_fails_startup_without_showing_it(bad_key: str) -> None:
    with pytest.raises(ConfigError, match=r"push\.apns\.key") as caught:
        build(apns_config(bad_key), bad_key)
    assert bad_key.strip() == "" or bad_key not in str(caught.value)


def test_an_rsa_key_is_not_an_apns_key() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    with pytest.raises(ConfigError, match=r"push\.apns\.key: not an EC P-256"):
        build(apns_config(pem), pem)


def test_a_missing_apns_key_fails_at_load_naming_the_key() -> None:
    raw = {"push": {"apns": {"key_id": KEY_ID, "team_id": TEAM_ID, "bundle_id": TOPIC}}}
    with pytest.raises(ConfigError, match=r"push\.apns\.key"):
        structure_config(raw, env={})
