"""``bothy-notify demo``: the plan cases, printed as a timeline, on the real gateway."""

from __future__ import annotations

import io

from bothy_notify.demo import run_demo
from tests.harness import make_config


def test_the_demo_walks_through_the_seven_plan_cases_and_succeeds(database_url: str) -> None:
    out = io.StringIO()

    code = run_demo(make_config(), "2s", out, database_url=database_url)

    text = out.getvalue()
    assert code == 0, text
    for expected in (
        "desktop  connects: hello -> ready -> unread -> catchup.complete (live)",
        "no hint, no push: active in the thread (skipped: active_in_thread)",
        "<- notification.created kind=message count=1",
        "nothing: the push was dropped, alex read it (skipped: read)",
        "(same nid",
        "(no delay: no desktop is live)",
        "reads #design up to message 4 (the phone was pushed for it) -> read.ack",
        "<- push kind=read thread_id=design seq=4 badge=0",
        "phone    snoozes (PUT /v1/quiet-hours snooze_until)",
        "shows both hints without a sound (quiet: true)",
        "<- push kind=summary count=1 badge=1",
        "sam      deletes message 7 (message.deleted, last_seq 6)",
        "<- notification.removed message_id=m7 badge=1",
        "<- push kind=removed message_id=m7 badge=1",
        "All seven cases behaved as planned.",
    ):
        assert expected in text, expected
    assert "Unexpected" not in text


def test_the_demo_refuses_a_delay_without_a_unit() -> None:
    out = io.StringIO()

    assert run_demo(make_config(), "3", out) == 2
    assert "--delay" in out.getvalue()
