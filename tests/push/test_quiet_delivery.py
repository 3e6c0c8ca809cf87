"""Quiet hours over the real APNs adapter (issue 20): while the person is snoozed
the fake APNs gets nothing; when the snooze ends it gets one summary, a passive
alert without sound, even when the app's hints go background style."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider
from testkit.fakes.apns import FakeApns
from tests.harness import Launch, device_token, ev, make_config
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

APNS_TOKEN = "cd" * 32


def message(thread: str, seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


async def test_a_snoozed_phone_gets_nothing_then_one_passive_summary_from_apns(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = ApnsProvider(
        credentials=ApnsCredentials(apns_key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=now_clock,
        hosts={"production": fake_apns.url, "sandbox": fake_apns.url},
        ca_file=ca_file,
    )
    node = await launch(
        config=make_config(notify={"coalesce_window": "0s"}),
        providers={"apns": apns},
        clock=now_clock,
    )
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        *(ev("thread.upserted", thread_id=t, space_id="s1") for t in ("t1", "t2", "t3")),
        *(
            ev("thread.followed", user_id="alex", thread_id=t, level="all")
            for t in ("t1", "t2", "t3")
        ),
    )
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    until = now_clock.now() + timedelta(minutes=10)
    answer = await node.request(
        "PUT",
        "/v1/quiet-hours",
        token=device_token("alex", "alex-phone"),
        json={"snooze_until": until.isoformat()},
    )
    assert answer.status_code == 200, answer.text

    await node.append(message("t1", 1), message("t2", 1), message("t3", 1))
    await node.settle()
    await node.append(ev("thread.read", user_id="alex", thread_id="t3", seq=1))
    await node.settle()
    assert fake_apns.requests == []

    await node.advance(10 * 60)
    await fake_apns.wait_for(1)

    (summary,) = fake_apns.requests
    assert summary.headers["apns-push-type"] == "alert"
    assert summary.headers["apns-priority"] == "5"
    assert summary.body == {
        "aps": {
            "alert": {"title": "New activity"},
            "mutable-content": 1,
            "interruption-level": "passive",
            "badge": 2,
        },
        "kind": "summary",
        "count": 2,
        "badge": 2,
        "urgency": "low",
    }
