"""Clear-on-read over the real APNs adapter (issue 20): a read on the desktop sends
the phone, which was pushed for the thread, one background push through the fake
APNs, even when the app's hints go alert style.
"""

from __future__ import annotations

from typing import Any

from bothy_notify.config import ApnsStyle
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.push.apns import ApnsCredentials, ApnsProvider
from bothy_notify.push.grouping import GROUPING_SECRET, ThreadGrouping
from testkit.fakes.apns import FakeApns
from tests.harness import Launch, device_token, ev, make_config
from tests.push.conftest import KEY_ID, TEAM_ID, TOPIC, ApnsKey

APNS_TOKEN = "ab" * 32


def message(seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


async def test_the_apns_request_of_a_read_push_is_background_priority_5_collapsed_on_the_thread(
    launch: Launch, fake_apns: FakeApns, apns_key: ApnsKey, ca_file: str, now_clock: FakeClock
) -> None:
    apns = ApnsProvider(
        credentials=ApnsCredentials(apns_key.private, KEY_ID, TEAM_ID),
        topic=TOPIC,
        clock=now_clock,
        hosts={"production": fake_apns.url, "sandbox": fake_apns.url},
        ca_file=ca_file,
        style=ApnsStyle.ALERT,
    )
    node = await launch(
        config=make_config(notify={"coalesce_window": "0s"}),
        providers={"apns": apns},
        clock=now_clock,
    )
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", APNS_TOKEN, provider="apns")
    await node.append(message(1))
    await node.settle()
    await fake_apns.wait_for(1)

    answer = await node.request(
        "PUT",
        "/v1/threads/t1/read",
        token=device_token("alex", "alex-desk", "macos"),
        json={"seq": 1},
    )
    assert answer.status_code == 200, answer.text
    await node.advance(2)
    await fake_apns.wait_for(2)

    hint, read = fake_apns.requests
    # Grouped by the HMAC of the thread id under the key the daemon stored at start.
    ((key,),) = await node.sql(
        "SELECT value FROM bothy.secrets WHERE name = %s AND retired_at IS NULL",
        (GROUPING_SECRET,),
    )
    group = ThreadGrouping(key).of("t1")
    assert hint.headers["apns-push-type"] == "alert"
    assert hint.body["aps"]["thread-id"] == hint.headers["apns-collapse-id"] == group
    assert read.headers["apns-push-type"] == "background"
    assert read.headers["apns-priority"] == "5"
    assert read.headers["apns-collapse-id"] == group
    assert read.body == {
        "aps": {"content-available": 1},
        "kind": "read",
        "thread_id": "t1",
        "seq": 1,
        "badge": 0,
        "urgency": "low",
    }
