"""Real providers inside the daemon: ``notify.push_send`` jobs through the runner to the
protocol fakes, with the token lifecycle, retry delays on the fake clock, the webhook
address checks at registration and at send, and per-provider permits."""

from __future__ import annotations

import base64
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trustme

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push import providers as provider_table
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider
from bothy_notify.push.fcm import FcmProvider, TokenUnavailable
from bothy_notify.push.port import PushProvider
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webhook import WebhookProvider
from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.fcm import PROJECT, FakeFcm, FcmAnswer, error_body
from testkit.fakes.webhook import HOST, SIGNING_KEY, WebhookReceiver
from tests.harness import Launch, Node, device_token, ev, make_config, start_node
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

APNS_TOKEN = "ab" * 32
IPAD_TOKEN = "cd" * 32
FCM_TOKEN = "fcm-token-alex"
PUBLIC = "93.184.216.34"


def apns(fake: FakeApns, key: ApnsKey, ca_file: str, clock: FakeClock) -> ApnsProvider:
    return ApnsProvider(
        credentials=ApnsCredentials(key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=clock,
        hosts={"production": fake.url, "sandbox": fake.url},
        ca_file=ca_file,
    )


async def people(node: Node) -> None:
    """Alex follows thread t1 in space s1; Sam writes there."""
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )


def message(seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def registration_token(node: Node, token: str) -> dict[str, Any]:
    ((invalidated_at, last_error, failure_count),) = await node.sql(
        "SELECT invalidated_at, last_error, failure_count FROM bothy.push_registrations"
        " WHERE token = %s",
        (token,),
    )
    return {
        "invalidated": invalidated_at is not None,
        "last_error": last_error,
        "failure_count": failure_count,
    }


async def registration(node: Node, provider: str) -> dict[str, Any]:
    rows = await node.sql(
        "SELECT invalidated_at, last_error, failure_count FROM bothy.push_registrations"
        " WHERE provider = %s",
        (provider,),
    )
    ((invalidated_at, last_error, failure_count),) = rows
    return {
        "invalidated": invalidated_at is not None,
        "last_error": last_error,
        "failure_count": failure_count,
    }


async def start(
    launch: Launch, clock: FakeClock, providers: dict[str, PushProvider], **push: Any
) -> Node:
    node = await launch(config=make_config(push=push), providers=providers, clock=clock)
    await people(node)
    return node


# ---------------------------------------------------------------- APNs lifecycle


@pytest.mark.parametrize(
    ("answer", "invalidated", "last_error"),
    [
        (Answer(200), False, None),
        (Answer(410, "Unregistered"), True, "Unregistered"),
        (Answer(400, "BadDeviceToken"), False, "BadDeviceToken"),
        (Answer(413, "PayloadTooLarge"), False, "PayloadTooLarge"),
    ],
)
async def test_apns_outcomes_drive_the_token_lifecycle(
    launch: Launch,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    answer: Answer,
    invalidated: bool,
    last_error: str | None,
) -> None:
    node = await start(launch, now_clock, {"apns": apns(fake_apns, apns_key, ca_file, now_clock)})
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    fake_apns.answer(APNS_TOKEN, answer)
    await node.append(message(1))
    await node.settle()

    assert fake_apns.count == 1
    assert await registration(node, "apns") == {
        "invalidated": invalidated,
        "last_error": last_error,
        "failure_count": 0,
    }


async def test_expired_provider_token_twice_is_rejected_and_the_registration_kept(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, now_clock, {"apns": apns(fake_apns, apns_key, ca_file, now_clock)})
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    expired = Answer(403, "ExpiredProviderToken")
    fake_apns.answer(APNS_TOKEN, expired, expired)
    await node.append(message(1))
    await node.settle()
    await node.advance(60)

    assert fake_apns.count == 2  # one send, one immediate resend, no retry
    assert await registration(node, "apns") == {
        "invalidated": False,
        "last_error": "ExpiredProviderToken",
        "failure_count": 0,
    }
    (job,) = await node.jobs("notify.push_send")
    assert job["state"] == "completed" and job["attempt"] == 1


async def test_one_send_failing_with_three_apns_503s_is_one_strike_not_an_invalidation(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(
        launch,
        now_clock,
        {"apns": apns(fake_apns, apns_key, ca_file, now_clock)},
        max_attempts=3,
    )
    await node.register("alex", "alex-ipad", IPAD_TOKEN, provider="apns")  # delivers
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    fake_apns.answer(APNS_TOKEN, *[Answer(503, "ServiceUnavailable")] * 3)
    await node.append(message(1))
    await node.settle()
    await node.advance(2)
    await node.advance(4)

    assert fake_apns.count == 4  # three attempts to the phone, one to the iPad
    assert await registration_token(node, APNS_TOKEN) == {
        "invalidated": False,
        "last_error": "ServiceUnavailable",
        "failure_count": 1,
    }


async def test_an_apns_host_that_cannot_be_reached_never_counts_a_strike(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    provider = ApnsProvider(
        credentials=ApnsCredentials(apns_key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=now_clock,
        hosts={"production": fake_apns.url, "sandbox": f"https://127.0.0.1:{closed_port()}"},
        ca_file=ca_file,
    )
    node = await start(launch, now_clock, {"apns": provider}, max_attempts=2, max_strikes=1)
    await node.register("alex", "alex-ipad", IPAD_TOKEN, provider="apns")  # delivers
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns", environment="sandbox")
    for seq in (1, 2):
        await node.append(message(seq))
        await node.settle()
        await node.advance(5)
        await node.advance(3600)

    assert fake_apns.count == 2  # the iPad's; the phone's host never answered
    assert await registration_token(node, APNS_TOKEN) == {
        "invalidated": False,
        "last_error": "connect_error",
        "failure_count": 0,
    }


# ---------------------------------------------------------------- FCM retry delays


def fcm(fake: FakeFcm, ca_file: str, clock: FakeClock) -> FcmProvider:
    return fake.provider(ca_file, clock)


@pytest.mark.parametrize(("retry_after", "waits"), [("120", 120), ("900", 300)])
async def test_fcm_503_retry_after_is_waited_on_the_clock_up_to_300_seconds(
    launch: Launch,
    fake_fcm: FakeFcm,
    ca_file: str,
    now_clock: FakeClock,
    retry_after: str,
    waits: int,
) -> None:
    node = await start(launch, now_clock, {"fcm": fcm(fake_fcm, ca_file, now_clock)})
    await node.register("alex", "alex-phone", FCM_TOKEN, provider="fcm", platform="android")
    fake_fcm.answer(
        FCM_TOKEN, FcmAnswer(503, error_body(503, "UNAVAILABLE"), (("retry-after", retry_after),))
    )
    await node.append(message(1))
    await node.settle()
    assert len(fake_fcm.requests) == 1

    await node.advance(waits - 1)
    assert len(fake_fcm.requests) == 1
    await node.advance(1)

    assert len(fake_fcm.requests) == 2
    (job,) = await node.jobs("notify.push_send")
    assert job["state"] == "completed"


async def test_fcm_unregistered_retires_and_invalid_argument_keeps(
    launch: Launch, fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, now_clock, {"fcm": fcm(fake_fcm, ca_file, now_clock)})
    await node.register("alex", "alex-phone", FCM_TOKEN, provider="fcm", platform="android")
    fake_fcm.answer(
        FCM_TOKEN, FcmAnswer(400, error_body(400, "INVALID_ARGUMENT", fcm="INVALID_ARGUMENT"))
    )
    await node.append(message(1))
    await node.settle()
    assert await registration(node, "fcm") == {
        "invalidated": False,
        "last_error": "INVALID_ARGUMENT",
        "failure_count": 0,
    }

    fake_fcm.answer(FCM_TOKEN, FcmAnswer(404, error_body(404, "NOT_FOUND", fcm="UNREGISTERED")))
    await node.append(message(2))
    await node.settle()
    assert (await registration(node, "fcm"))["invalidated"]


class SwitchableAccessTokens:
    """An in-memory ``AccessTokens``: a fixed token, or the token endpoint unreachable."""

    def __init__(self) -> None:
        self.unreachable = False

    async def token(self) -> str:
        await trio.lowlevel.checkpoint()
        if self.unreachable:
            raise TokenUnavailable("the token endpoint could not be reached")
        return "ya29.fake-static"

    def invalidate(self, token: str) -> None:
        return None

    def peek(self) -> str | None:
        return None  # nothing cached: every send asks the endpoint


async def test_an_fcm_token_endpoint_failure_never_counts_a_strike(
    launch: Launch, fake_fcm: FakeFcm, ca_file: str, now_clock: FakeClock
) -> None:
    tokens = SwitchableAccessTokens()
    provider = FcmProvider(
        project_id=PROJECT,
        tokens=tokens,
        clock=now_clock,
        endpoint=fake_fcm.url,
        ca_file=ca_file,
    )
    fake_fcm.issued.append("ya29.fake-static")
    node = await start(launch, now_clock, {"fcm": provider}, max_attempts=2, max_strikes=1)
    await node.register("sam", "sams-phone", "fcm-token-sam", provider="fcm", platform="android")
    await node.append(ev("thread.followed", user_id="sam", thread_id="t1", level="all"))
    by_pat = message(1)
    by_pat["payload"]["author_id"] = "pat"
    await node.append(by_pat)
    await node.settle()
    assert len(fake_fcm.requests) == 1  # FCM delivered to Sam
    await node.register("alex", "alex-phone", FCM_TOKEN, provider="fcm", platform="android")
    tokens.unreachable = True
    await node.append(message(2))
    await node.settle()
    await node.advance(30)

    assert len(fake_fcm.requests) == 1
    assert await registration_token(node, FCM_TOKEN) == {
        "invalidated": False,
        "last_error": "token_unavailable",
        "failure_count": 0,
    }


# ---------------------------------------------------------------- webhooks


@pytest.fixture
async def receiver(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[WebhookReceiver]:
    hooks = WebhookReceiver(ca=ca)
    await nursery.start(hooks.serve)
    yield hooks


def hooks(
    resolver: FakeResolver, clock: FakeClock, ca_file: str, *, private: bool
) -> WebhookProvider:
    return WebhookProvider(
        allowed_domains=(HOST,),
        allow_private_addresses=private,
        resolver=resolver,
        clock=clock,
        ca_file=ca_file,
    )


async def register_hook(node: Node, url: str, device: str = "alex-bot") -> Any:
    return await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "webhook", "token": url, "signing_key": SIGNING_KEY},
        token=device_token("alex", device, "linux"),
    )


async def test_a_webhook_host_resolving_to_loopback_is_refused_at_registration(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    node = await start(
        launch, now_clock, {"webhook": hooks(resolver, now_clock, ca_file, private=False)}
    )
    response = await register_hook(node, receiver.url())

    assert response.status_code == 422
    error = response.json()["error"]
    assert "private or local address" in error["message"]
    assert HOST not in response.text
    assert await node.sql("SELECT 1 FROM bothy.push_registrations") == []


@pytest.mark.parametrize(
    "url",
    ["http://hooks.bothy.test/h", "https://other.example/h", "https://user:pw@hooks.bothy.test/h"],
)
async def test_a_webhook_url_that_is_not_https_or_not_allowed_is_refused(
    launch: Launch, ca_file: str, now_clock: FakeClock, url: str
) -> None:
    resolver = FakeResolver({HOST: [PUBLIC], "other.example": [PUBLIC]})
    node = await start(
        launch, now_clock, {"webhook": hooks(resolver, now_clock, ca_file, private=False)}
    )
    response = await register_hook(node, url)
    assert response.status_code == 422
    assert response.json()["error"]["code"]


async def test_a_webhook_host_that_turns_private_after_registration_is_refused_at_send(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: [PUBLIC]})
    node = await start(
        launch, now_clock, {"webhook": hooks(resolver, now_clock, ca_file, private=False)}
    )
    response = await register_hook(node, receiver.url())
    assert response.status_code == 201
    resolver.set(HOST, "127.0.0.1")
    await node.append(message(1))
    await node.settle()

    assert receiver.deliveries == []
    assert await registration(node, "webhook") == {
        "invalidated": False,
        "last_error": "private_address",
        "failure_count": 0,
    }


async def test_a_webhook_is_delivered_signed_with_user_and_registration(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    node = await start(
        launch, now_clock, {"webhook": hooks(resolver, now_clock, ca_file, private=True)}
    )
    created = (await register_hook(node, receiver.url())).json()
    await node.append(message(1))
    await node.settle()

    (delivery,) = receiver.deliveries
    assert delivery.verified
    assert delivery.body["user_id"] == "alex"
    assert delivery.body["registration_id"] == created["id"]
    assert delivery.body["message_id"] == "m1"


@pytest.mark.parametrize(
    ("answers", "invalidated", "job_state"),
    [
        ((404, 404, 404), True, "completed"),
        ((404, 500, 404), False, "failed"),
        ((410, 200), False, "completed"),
    ],
)
async def test_webhook_404_or_410_is_dead_only_when_every_attempt_answered_so(
    launch: Launch,
    receiver: WebhookReceiver,
    ca_file: str,
    now_clock: FakeClock,
    answers: tuple[int, ...],
    invalidated: bool,
    job_state: str,
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    node = await start(
        launch,
        now_clock,
        {"webhook": hooks(resolver, now_clock, ca_file, private=True)},
        max_attempts=3,
        max_strikes=10,
    )
    await register_hook(node, receiver.url())
    receiver.answer("/hook", *answers)
    await node.append(message(1))
    await node.settle()
    for _ in range(len(answers) - 1):
        await node.advance(5)

    assert len(receiver.deliveries) == len(answers)
    assert (await registration(node, "webhook"))["invalidated"] is invalidated
    (job,) = await node.jobs("notify.push_send")
    assert job["state"] == job_state


OTHER_KEY = base64.b64encode(b"another-key-of-32-bytes-for-pat!").decode()


async def test_a_webhook_url_registered_by_two_people_is_two_registrations_with_own_keys(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    node = await start(
        launch, now_clock, {"webhook": hooks(resolver, now_clock, ca_file, private=True)}
    )
    await node.append(
        ev("user.upserted", user_id="pat", kind="human", active=True),
        ev("member.added", user_id="pat", scope_id="s1"),
        ev("thread.followed", user_id="pat", thread_id="t1", level="all"),
    )
    alex = await register_hook(node, receiver.url())
    pat = await node.request(
        "POST",
        "/v1/registrations",
        json={"provider": "webhook", "token": receiver.url(), "signing_key": OTHER_KEY},
        token=device_token("pat", "pat-bot", "linux"),
    )

    assert (alex.status_code, pat.status_code) == (201, 201)
    assert alex.json()["id"] != pat.json()["id"]
    listed = await node.request(
        "GET", "/v1/registrations", token=device_token("alex", "alex-bot", "linux")
    )
    assert [r["id"] for r in listed.json()["registrations"]] == [alex.json()["id"]]

    await node.append(message(1))
    await node.settle()
    # The receiver verifies with Alex's key: Alex's hint verifies, Pat's (signed with
    # Pat's own key) does not, and Alex's never went to Pat's registration.
    verified = [d for d in receiver.deliveries if d.verified]
    assert len(receiver.deliveries) == 2 and len(verified) == 1
    assert verified[0].body["user_id"] == "alex"
    assert verified[0].body["registration_id"] == alex.json()["id"]


DOWN_HOST = "down.bothy.test"


async def test_a_webhook_host_down_for_a_day_while_others_deliver_is_invalidated_after_max_strikes(
    launch: Launch, receiver: WebhookReceiver, ca_file: str, now_clock: FakeClock
) -> None:
    # down.bothy.test resolves to 127.0.0.2, where nothing listens: every attempt is refused.
    resolver = FakeResolver({HOST: ["127.0.0.1"], DOWN_HOST: ["127.0.0.2"]})
    provider = WebhookProvider(
        allowed_domains=(HOST, DOWN_HOST),
        allow_private_addresses=True,
        resolver=resolver,
        clock=now_clock,
        ca_file=ca_file,
    )
    node = await start(launch, now_clock, {"webhook": provider}, max_attempts=2)
    await node.append(
        ev("user.upserted", user_id="pat", kind="human", active=True),
        ev("member.added", user_id="pat", scope_id="s1"),
        ev("thread.followed", user_id="pat", thread_id="t1", level="all"),
    )
    for user, url in (("pat", receiver.url("/ok")), ("alex", receiver.url("/hook", DOWN_HOST))):
        response = await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "webhook", "token": url, "signing_key": SIGNING_KEY},
            token=device_token(user, f"{user}-bot", "linux"),
        )
        assert response.status_code == 201
    down = receiver.url("/hook", DOWN_HOST)

    states = []
    for seq in range(1, 13):  # a message every two hours for a day
        await node.append(message(seq))
        await node.settle()
        await node.advance(5)  # the send's second attempt
        states.append(await registration_token(node, down))
        await node.advance(2 * 3600)

    assert [s["failure_count"] for s in states[:3]] == [1, 2, 3]
    assert [s["invalidated"] for s in states] == [False, False] + [True] * 10
    assert states[0]["last_error"] == "connect_error"
    assert len([d for d in receiver.deliveries if d.path == "/ok"]) == 12  # Pat's, every time
    assert node.skipped("no_registration") == 9  # Alex has no route once invalidated


# ---------------------------------------------------------------- isolation


async def test_a_stalled_webhook_host_holds_only_webhook_permits_while_apns_delivers(
    launch: Launch,
    receiver: WebhookReceiver,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})
    providers: dict[str, PushProvider] = {
        "apns": apns(fake_apns, apns_key, ca_file, now_clock),
        "webhook": hooks(resolver, now_clock, ca_file, private=True),
    }
    node = await start(launch, now_clock, providers, max_in_flight=4)
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    for i in range(6):
        receiver.stall_paths.add(f"/slow{i}")
        assert (await register_hook(node, receiver.url(f"/slow{i}"))).status_code == 201
    messages = 30

    await node.append(*[message(seq) for seq in range(1, messages + 1)])
    with trio.fail_after(8):  # well inside the webhooks' 10 s bound: nothing timed out
        await fake_apns.wait_for(messages)
        while receiver.stalled < 4:
            await receiver.changed.wait()
    assert node.daemon.providers is not None
    in_flight = node.daemon.providers.statistics()
    assert in_flight["webhook"] == 4  # every webhook permit is held by the stalled host
    assert receiver.stalled == 4 and receiver.deliveries == []
    assert fake_apns.count == messages  # APNs delivered every push meanwhile


async def test_a_webhook_host_removed_from_allowed_domains_gets_nothing_after_a_restart(
    nursery: trio.Nursery,
    database_url: str,
    receiver: WebhookReceiver,
    ca_file: str,
    now_clock: FakeClock,
) -> None:
    resolver = FakeResolver({HOST: ["127.0.0.1"]})

    def configured(*domains: str) -> tuple[Any, Any]:
        config = make_config(
            push={
                "webhook": {
                    "allowed_domains": list(domains),
                    "allow_private_addresses": True,
                    "ca_file": ca_file,
                }
            }
        )
        built = provider_table.build(config.push, dev=False, clock=now_clock, resolver=resolver)
        return config, built

    config, built = configured(HOST)
    async with trio.open_nursery() as first:
        node = await start_node(
            first, database_url, clock=now_clock, config=config, providers=built
        )
        await people(node)
        assert (await register_hook(node, receiver.url())).status_code == 201
        await node.append(message(1))
        await node.settle()
        assert len(receiver.deliveries) == 1
        await node.http.aclose()
        first.cancel_scope.cancel()

    # The operator removes the host from push.webhook.allowed_domains and restarts.
    config, built = configured("other.bothy.test")
    async with trio.open_nursery() as second:
        node = await start_node(
            second, database_url, clock=now_clock, config=config, providers=built
        )
        await node.append(message(2))
        await node.settle()
        assert len(receiver.deliveries) == 1  # not contacted
        assert await registration(node, "webhook") == {
            "invalidated": False,
            "last_error": "domain_not_allowed",
            "failure_count": 0,
        }
        (job,) = [j for j in await node.jobs("notify.push_send") if j["args"]["message_id"] == "m2"]
        assert (job["state"], job["attempt"]) == ("completed", 1)  # rejected: no retry
        await node.http.aclose()
        second.cancel_scope.cancel()
