"""``POST /_matrix/push/v1/notify`` on a running daemon, pushing to the fake APNs (or a
fake Web Push service): content-free pushes, one per (event, pushkey), and a
``rejected`` that lists exactly the pushkeys declared gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trustme
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.resolver import FakeResolver
from bothy_notify.push.webpush import WebPushProvider, public_key_b64
from testkit.fakes.apns import Answer, FakeApns
from testkit.fakes.webpush import HOST, FakePushService
from tests.harness import Launch, Node, make_config
from tests.job_args import assert_ids_and_integers
from tests.push.conftest import ApnsKey
from tests.push.test_delivery import apns

IOS = "im.example.ios"
WEB = "im.example.web"
PUSHKEY = "ab" * 32
OTHER = "cd" * 32
EVENT = "$3957tyerfgewrf384:example.org"
ROOM = "!slw48wfj34rtnrf:example.org"
SECRET = "I'm floating in a most peculiar way"


def notification(*devices: dict[str, Any], **members: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_id": EVENT,
        "room_id": ROOM,
        "type": "m.room.message",
        "sender": "@major:tom.example",
        "sender_display_name": "Major Tom",
        "room_name": "Ground Control",
        "room_alias": "#control:example.org",
        "prio": "high",
        "content": {"msgtype": "m.text", "body": SECRET},
        "counts": {"unread": 2, "missed_calls": 1},
        "devices": list(devices) or [device()],
    }
    body.update(members)
    return {"notification": {k: v for k, v in body.items() if v is not None}}


def device(pushkey: str = PUSHKEY, app_id: str = IOS, **extra: Any) -> dict[str, Any]:
    return {
        "app_id": app_id,
        "pushkey": pushkey,
        "pushkey_ts": 1_700_000_000,
        "data": {"format": "event_id_only"},
        **extra,
    }


async def start(
    launch: Launch,
    fake: FakeApns,
    key: ApnsKey,
    ca_file: str,
    clock: FakeClock,
    **gateway: Any,
) -> Node:
    settings = {"apps": {IOS: "apns"}, **gateway}
    return await launch(
        config=make_config(matrix_gateway=settings),
        providers={"apns": apns(fake, key, ca_file, clock)},
        clock=clock,
    )


async def notify(node: Node, body: Any) -> httpx.Response:
    return await node.request("POST", "/_matrix/push/v1/notify", json=body)


def counted(node: Node, app: str, outcome: str) -> float:
    """``bothy_matrix_notifications_total{app,outcome}`` of the node."""
    value = node.daemon.metrics.registry.get_sample_value(
        "bothy_matrix_notifications_total", {"app": app, "outcome": outcome}
    )
    return float(value or 0.0)


async def test_a_notification_reaches_the_phone_content_free(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    answer = await notify(node, notification())
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"rejected": []}
    (push,) = fake_apns.requests
    assert push.device_token == PUSHKEY
    body = dict(push.body)
    aps = body.pop("aps")
    assert aps == {"content-available": 1}
    assert body == {
        "event_id": EVENT,
        "room_id": ROOM,
        "unread": 2,
        "missed_calls": 1,
        "urgency": "normal",
    }
    sent = str(push.body) + str(push.headers)
    for never in (SECRET, "Major Tom", "Ground Control", "#control", "@major"):
        assert never not in sent
    assert counted(node, IOS, "delivered") == 1
    ((owner, provider, token),) = await node.sql(
        "SELECT user_id, provider, token FROM bothy.push_registrations"
    )
    assert (owner, provider, token) == (f"matrix-gateway/{IOS}", "apns", PUSHKEY)


async def test_the_jobs_args_hold_ids_and_integers_only(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    assert (await notify(node, notification())).status_code == 200
    (job,) = await node.jobs("matrix.push_send")
    args = dict(job["args"])
    assert args.pop("event_id") == EVENT and args.pop("room_id") == ROOM  # Matrix IDs
    assert args.pop("urgency") == "normal"
    assert_ids_and_integers(args)
    assert SECRET not in str(job["args"])


async def test_an_unknown_app_id_is_rejected_and_nothing_is_sent(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    answer = await notify(node, notification(device(app_id="im.other"), device(OTHER)))
    assert answer.json() == {"rejected": [PUSHKEY]}
    assert [r.device_token for r in fake_apns.requests] == [OTHER]
    assert counted(node, "unknown", "rejected") == 1


async def test_a_pushkey_that_can_never_be_an_apns_token_is_rejected(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    answer = await notify(node, notification(device("not-hex")))
    assert answer.json() == {"rejected": ["not-hex"]}
    assert fake_apns.requests == []


async def test_an_unregistered_pushkey_is_rejected_now_and_at_every_later_notify(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(PUSHKEY, Answer(410, "Unregistered"))
    assert (await notify(node, notification())).json() == {"rejected": [PUSHKEY]}
    later = await notify(node, notification(event_id="$another-event"))
    assert later.json() == {"rejected": [PUSHKEY]}
    assert len(fake_apns.requests) == 1  # declared gone: never sent again
    await node.settle()
    assert await node.sql(
        "SELECT invalidated_at IS NOT NULL, last_error FROM bothy.push_registrations"
    ) == [(True, "Unregistered")]


async def test_a_pusher_set_again_after_it_was_gone_is_pushed_again(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(PUSHKEY, Answer(410, "Unregistered"))
    assert (await notify(node, notification())).json() == {"rejected": [PUSHKEY]}
    await node.settle()
    set_again = int(now_clock.now().timestamp()) + 60
    answer = await notify(
        node, notification(device(pushkey_ts=set_again), event_id="$after-reinstall")
    )
    assert answer.json() == {"rejected": []}
    assert len(fake_apns.requests) == 2


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (Answer(400, "BadDeviceToken"), "refused"),
        (Answer(400, "DeviceTokenNotForTopic"), "refused"),
        (Answer(400, "PayloadTooLarge"), "refused"),
        (Answer(503, "ServiceUnavailable"), "pending"),
    ],
)
async def test_a_misconfiguration_or_a_transient_failure_is_never_rejected(
    launch: Launch,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    answer: Answer,
    outcome: str,
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(PUSHKEY, answer)
    assert (await notify(node, notification())).json() == {"rejected": []}
    assert counted(node, IOS, outcome) == 1
    await node.settle()
    ((invalidated,),) = await node.sql(
        "SELECT invalidated_at IS NOT NULL FROM bothy.push_registrations"
    )
    assert not invalidated


async def test_a_transient_failure_is_retried_by_the_runner(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    fake_apns.answer(PUSHKEY, Answer(503, "ServiceUnavailable"))
    assert (await notify(node, notification())).json() == {"rejected": []}
    await node.advance(30)
    assert [r.status for r in fake_apns.requests] == [503, 200]


async def test_the_same_event_again_sends_nothing(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    assert (await notify(node, notification())).json() == {"rejected": []}
    assert (await notify(node, notification())).json() == {"rejected": []}
    assert len(fake_apns.requests) == 1
    assert counted(node, IOS, "duplicate") == 1


async def test_concurrent_requests_each_get_their_own_answer(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    """Requests that arrive while another's transaction runs are stored together: each
    still gets its own rejected, and one (event, pushkey) in two of them is sent once."""
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    keys = [f"{i:064x}" for i in range(1, 9)]
    gone = keys[3]
    fake_apns.answer(gone, Answer(410, "Unregistered"))
    bodies = [notification(device(k), event_id=f"$event-{k[-1]}") for k in keys]
    bodies.append(notification(device(keys[0]), event_id="$event-1"))  # the same push again
    answers: dict[int, httpx.Response] = {}

    async def send(i: int, body: dict[str, Any]) -> None:
        answers[i] = await notify(node, body)

    async with trio.open_nursery() as nursery:
        for i, body in enumerate(bodies):
            nursery.start_soon(send, i, body)
    assert {i: a.json() for i, a in answers.items()} == {
        i: {"rejected": [gone] if i == 3 else []} for i in range(len(bodies))
    }
    assert sorted(r.device_token for r in fake_apns.requests) == keys
    assert counted(node, IOS, "duplicate") == 1
    assert counted(node, IOS, "delivered") == len(keys) - 1
    assert counted(node, IOS, "rejected") == 1


async def test_a_badge_update_is_a_background_push_each_time(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    # Synapse's badge update: no event, "type": null.
    badge = {
        "notification": {
            "id": "",
            "type": None,
            "sender": "",
            "counts": {"unread": 0},
            "devices": [device()],
        }
    }
    for _ in range(2):
        assert (await notify(node, badge)).json() == {"rejected": []}
    assert [r.body for r in fake_apns.requests] == [
        {"aps": {"content-available": 1}, "unread": 0, "urgency": "normal"}
    ] * 2


async def test_the_answer_waits_at_most_answer_within(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock, answer_within="200ms")
    fake_apns.stall()
    started = trio.current_time()
    answer = await notify(node, notification())
    waited = trio.current_time() - started
    assert answer.json() == {"rejected": []}
    assert 0.2 <= waited < 5
    assert counted(node, IOS, "pending") == 1
    fake_apns.resume()


@pytest.mark.parametrize(
    ("body", "member"),
    [
        (b"not json", "the body is not valid JSON"),
        (b"[]", "the body: expected an object"),
        (b'{"notification": {"devices": []}}', "notification.devices"),
        (b'{"notification": {"devices": [{"app_id": "a"}]}}', "notification.devices[0].pushkey"),
    ],
)
async def test_a_malformed_body_is_400_m_bad_json(
    launch: Launch,
    fake_apns: FakeApns,
    apns_key: ApnsKey,
    ca_file: str,
    now_clock: FakeClock,
    body: bytes,
    member: str,
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock)
    answer = await node.request("POST", "/_matrix/push/v1/notify", content=body)
    assert answer.status_code == 400
    assert answer.json()["errcode"] == "M_BAD_JSON"
    assert answer.json()["error"].startswith(member)


async def test_more_devices_than_max_devices_are_400(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(launch, fake_apns, apns_key, ca_file, now_clock, max_devices=2)
    devices = [device(f"{i:02x}" * 32) for i in range(3)]
    answer = await notify(node, notification(*devices))
    assert answer.status_code == 400 and answer.json()["errcode"] == "M_BAD_JSON"
    assert fake_apns.requests == []


async def test_a_source_address_over_its_rate_is_429(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    node = await start(
        launch,
        fake_apns,
        apns_key,
        ca_file,
        now_clock,
        requests_per_second=1,
        requests_burst=1,
    )
    assert (await notify(node, notification())).status_code == 200
    refused = await notify(node, notification(event_id="$next"))
    assert refused.status_code == 429
    assert refused.json()["errcode"] == "M_LIMIT_EXCEEDED"
    assert refused.json()["retry_after_ms"] >= 1
    assert len(fake_apns.requests) == 1


async def test_without_the_section_the_endpoint_is_unrecognized(launch: Launch) -> None:
    node = await launch()
    answer = await notify(node, notification())
    assert answer.status_code == 404
    assert answer.json()["errcode"] == "M_UNRECOGNIZED"


# ---------------------------------------------------------------- Web Push apps


@pytest.fixture
async def push_service(nursery: trio.Nursery, ca: trustme.CA) -> AsyncIterator[FakePushService]:
    fake = FakePushService(ca=ca)
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == []


async def test_a_web_push_pusher_gets_its_push_encrypted_in_either_form(
    launch: Launch, push_service: FakePushService, ca_file: str, now_clock: FakeClock
) -> None:
    vapid = ec.generate_private_key(ec.SECP256R1())
    push_service.server_key = public_key_b64(vapid)
    sender = WebPushProvider(
        key=vapid,
        subject="mailto:ops@bothy.test",
        allowed_endpoints=(HOST,),
        allow_private_addresses=True,
        clock=now_clock,
        resolver=FakeResolver({HOST: ["127.0.0.1"]}),
        ca_file=ca_file,
    )
    node = await launch(
        config=make_config(matrix_gateway={"apps": {WEB: "webpush"}}),
        providers={"webpush": sender},
        clock=now_clock,
    )
    spec_form = push_service.subscribe("spec").subscription()
    sygnal_form = push_service.subscribe("sygnal").subscription()
    devices = [
        device(spec_form["endpoint"], WEB, data={"keys": spec_form["keys"]}),
        device(
            sygnal_form["keys"]["p256dh"],
            WEB,
            data={"endpoint": sygnal_form["endpoint"], "auth": sygnal_form["keys"]["auth"]},
        ),
        device("https://elsewhere.example/push/1", WEB, data={"keys": spec_form["keys"]}),
        device("https://push.bothy.test/push/no-keys", WEB),
    ]
    answer = await notify(node, notification(*devices))
    # An endpoint outside allowed_endpoints is not sent and not rejected; one
    # without keys can never be pushed to.
    assert answer.json() == {"rejected": ["https://push.bothy.test/push/no-keys"]}
    assert sorted(p.sub_id for p in push_service.delivered()) == ["spec", "sygnal"]
    for push in push_service.delivered():
        assert push.payload == {
            "event_id": EVENT,
            "room_id": ROOM,
            "unread": 2,
            "missed_calls": 1,
            "urgency": "normal",
        }
    assert counted(node, WEB, "refused") == 1
