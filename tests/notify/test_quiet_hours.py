"""Quiet hours end to end (issue 20): ``PUT /v1/quiet-hours`` -> the round (the
desktop's hint carries ``quiet: true``) -> ``notify.push_send`` holds the phone's
push -> at the period's end ``notify.quiet_summary`` -> one ``summary`` push per
registration through ``notify.push_summary``, or nothing when everything held was
read meanwhile. The real PostgreSQL, the fake provider, the fake clock (a period
ends by moving it, never by sleeping).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.fake_gateway import FakeGateway, gateway_factory
from tests.harness import Launch, Node, device_token, ev, make_config, two_followed_threads

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
"""The fake clock's start: a Monday, 09:00 UTC (10:00 in Berlin)."""
PHONE = device_token("alex", "alex-phone")
CONFIG = {
    "notify": {"coalesce_window": "0s", "mobile_delay_when_desktop_active": "0s"},
}


async def start(launch: Launch) -> tuple[Node, FakeGateway]:
    """Alex follows t1 and t2 in s1, with a registered phone and a live desktop."""
    gateway = FakeGateway()
    node = await launch(config=make_config(**CONFIG), gateway_factory=gateway_factory(gateway))
    await node.append(*two_followed_threads())
    await node.register("alex", "alex-phone", "phone-token")
    await node.settle()
    gateway.live("alex", "alex-desk")
    return node, gateway


def message(thread: str, seq: int) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"{thread}-m{seq}",
        thread_seq=seq,
        author_id="sam",
        mentions=[],
    )


async def put_quiet(node: Node, body: dict[str, Any]) -> dict[str, Any]:
    answer = await node.request("PUT", "/v1/quiet-hours", token=PHONE, json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


async def snooze(node: Node, minutes: int) -> None:
    until = node.clock.now() + timedelta(minutes=minutes)
    await put_quiet(node, {"snooze_until": until.isoformat().replace("+00:00", "Z")})


def phone_pushes(node: Node) -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == "phone-token"]


async def pushed(node: Node, *events: dict[str, Any]) -> None:
    await node.append(*events)
    await node.settle()


def summaries(node: Node, result: str) -> float:
    value = node.metrics.registry.get_sample_value(
        "bothy_quiet_summaries_total", {"result": result}
    )
    return value or 0.0


async def test_quiet_desktop_hint_says_quiet_phone_is_held_and_summarised_at_the_end(
    launch: Launch,
) -> None:
    node, gateway = await start(launch)
    await snooze(node, 60)

    await pushed(node, message("t1", 1), message("t1", 2), message("t2", 1))

    assert [h["quiet"] for h in gateway.hints_for("alex")] == [True, True, True]
    assert phone_pushes(node) == []
    held = node.metrics.registry.get_sample_value("bothy_push_held_total", {"category": "messages"})
    assert held == 3
    assert len(await node.sql("SELECT 1 FROM bothy.held_pushes")) == 2  # one per thread

    await node.advance(59 * 60)
    assert phone_pushes(node) == []
    await node.advance(60)

    assert phone_pushes(node) == [{"kind": "summary", "count": 2, "badge": 2, "urgency": "low"}]
    assert summaries(node, "sent") == 1
    assert await node.sql("SELECT 1 FROM bothy.held_pushes") == []

    await pushed(node, message("t1", 3))  # no longer quiet: sent at once, not quiet
    assert phone_pushes(node)[-1]["kind"] == "message"
    assert gateway.hints_for("alex")[-1]["quiet"] is False


async def test_a_summary_mentions_only_threads_still_unread(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 30)
    await pushed(node, message("t1", 1), message("t2", 1))

    await node.append(ev("thread.read", user_id="alex", thread_id="t1", seq=1))
    await node.settle()
    await node.advance(30 * 60)

    summary = [p for p in phone_pushes(node) if p["kind"] == "summary"]
    assert summary == [{"kind": "summary", "count": 1, "badge": 1, "urgency": "low"}]


async def test_nothing_at_all_when_everything_held_was_read_meanwhile(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 30)
    await pushed(node, message("t1", 1), message("t2", 1))

    await node.append(
        ev("thread.read", user_id="alex", thread_id="t1", seq=1),
        ev("thread.read", user_id="alex", thread_id="t2", seq=1),
    )
    await node.settle()
    await node.advance(30 * 60)

    assert [p for p in phone_pushes(node) if p["kind"] != "read"] == []
    assert summaries(node, "nothing_unread") == 1
    assert summaries(node, "sent") == 0
    assert await node.jobs("notify.push_summary") == []


async def test_security_breaks_through_quiet_hours(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 60)

    await pushed(
        node,
        ev(
            "device.upserted",
            device_id="new-laptop",
            user_id="alex",
            platform="macos",
            state="pending",
        ),
        message("t1", 1),
    )

    assert [p["kind"] for p in phone_pushes(node)] == ["security"]


async def test_a_breakthrough_category_is_sent_while_quiet(launch: Launch) -> None:
    node, _gateway = await start(launch)
    until = (NOW + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    await put_quiet(node, {"snooze_until": until, "breakthrough": ["messages"]})

    await pushed(node, message("t1", 1))

    assert [p["kind"] for p in phone_pushes(node)] == ["message"]


async def test_a_schedule_in_the_persons_zone_holds_and_ends_on_its_wall_clock(
    launch: Launch,
) -> None:
    node, gateway = await start(launch)
    # 10:00 in Berlin on a Monday: quiet from 09:30 to 10:30 there, 09:30 UTC here.
    await put_quiet(
        node,
        {
            "time_zone": "Europe/Berlin",
            "schedule": [{"days": ["mon"], "start": "09:30", "end": "10:30"}],
        },
    )
    await pushed(node, message("t1", 1))
    assert phone_pushes(node) == [] and gateway.hints_for("alex")[0]["quiet"] is True

    await node.advance(29 * 60)
    assert phone_pushes(node) == []
    await node.advance(60)
    assert [p["kind"] for p in phone_pushes(node)] == ["summary"]


async def test_clearing_quiet_hours_during_a_period_moves_the_summary_to_now(
    launch: Launch,
) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 120)
    await pushed(node, message("t1", 1))

    assert await put_quiet(node, {}) == {
        "time_zone": "UTC",
        "schedule": [],
        "snooze_until": None,
        "breakthrough": [],
    }
    await node.settle()

    assert phone_pushes(node) == [{"kind": "summary", "count": 1, "badge": 1, "urgency": "low"}]


async def test_extending_the_snooze_moves_the_summary_to_the_new_end(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 30)
    await pushed(node, message("t1", 1))
    await snooze(node, 90)

    await node.advance(30 * 60)
    assert phone_pushes(node) == []
    await node.advance(60 * 60)
    assert [p["kind"] for p in phone_pushes(node)] == ["summary"]
    assert len(await node.jobs("notify.quiet_summary")) == 1


async def test_each_active_registration_gets_one_summary(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await node.register("alex", "alex-tablet", "tablet-token")
    await snooze(node, 10)
    await pushed(node, message("t1", 1))

    await node.advance(10 * 60)

    sends = sorted((s.token, s.payload["kind"]) for s in node.fake.sends)
    assert sends == [("phone-token", "summary"), ("tablet-token", "summary")]
    (summary,) = await node.jobs("notify.quiet_summary")
    assert summary["state"] == "completed"


async def test_a_second_period_after_a_summary_queues_its_own(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 10)
    await pushed(node, message("t1", 1))
    await node.advance(10 * 60)
    await snooze(node, 10)
    await pushed(node, message("t2", 1))

    await node.advance(10 * 60)

    assert [p["count"] for p in phone_pushes(node) if p["kind"] == "summary"] == [1, 1]
    assert len(await node.jobs("notify.quiet_summary")) == 2


async def test_a_summary_for_a_person_without_registrations_is_a_skip(launch: Launch) -> None:
    node, _gateway = await start(launch)
    await snooze(node, 10)
    await pushed(node, message("t1", 1))
    await node.sql("DELETE FROM bothy.push_registrations WHERE token = 'phone-token'")

    await node.advance(10 * 60)

    (summary,) = await node.jobs("notify.quiet_summary")
    assert summary["state"] == "completed"
    assert await node.jobs("notify.push_summary") == []
    assert summaries(node, "sent") == 0
    assert node.skipped("no_registration") == 1


async def test_an_app_hint_goes_by_the_category_it_names(launch: Launch) -> None:
    # The kind is in no catalogue: the category travels with the push job.
    notify = {**CONFIG["notify"], "categories": ["social", "games"]}
    node = await launch(config=make_config(notify=notify))
    await node.append(ev("user.upserted", user_id="alex", kind="human", active=True))
    await node.register("alex", "alex-phone", "phone-token")
    until = (node.clock.now() + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    await put_quiet(node, {"snooze_until": until, "breakthrough": ["social"]})
    request = {"recipients": ["alex"], "category": "social", "target_id": "sam"}

    await pushed(node, ev("hint.requested", kind="social:poke", **request))
    await pushed(node, ev("hint.requested", kind="games:turn", **{**request, "category": "games"}))

    assert [p["kind"] for p in phone_pushes(node)] == ["social:poke"]
    held = node.metrics.registry.get_sample_value("bothy_push_held_total", {"category": "games"})
    assert held == 1
