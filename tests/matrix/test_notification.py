"""A notify request read as values: what is taken, what is never read, what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from bothy_notify.matrix.notification import (
    BadNotification,
    Device,
    answer,
    parse,
)

EVENT = "$3957tyerfgewrf384:example.org"
ROOM = "!slw48wfj34rtnrf:example.org"
DEVICE = {"app_id": "im.example.ios", "pushkey": "a1b2c3", "pushkey_ts": 1700000000}


def body(**notification: Any) -> dict[str, Any]:
    notification.setdefault("devices", [DEVICE])
    return {"notification": notification}


def test_the_spec_example_reads_ids_counts_urgency_and_devices() -> None:
    parsed = parse(
        body(
            event_id=EVENT,
            room_id=ROOM,
            type="m.room.message",
            sender="@exampleuser:matrix.org",
            sender_display_name="Major Tom",
            room_name="Mission Control",
            room_alias="#exampleroom:matrix.org",
            prio="high",
            content={"msgtype": "m.text", "body": "I'm floating in a most peculiar way."},
            counts={"unread": 2, "missed_calls": 1},
            devices=[
                {
                    "app_id": "org.matrix.matrixConsole.ios",
                    "pushkey": "V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/",
                    "pushkey_ts": 12345678,
                    "data": {},
                    "tweaks": {"sound": "bing"},
                }
            ],
        ),
        max_devices=100,
    )
    assert (parsed.event_id, parsed.room_id) == (EVENT, ROOM)
    assert (parsed.unread, parsed.missed_calls, parsed.urgency) == (2, 1, "normal")
    assert parsed.devices == (
        Device(
            "org.matrix.matrixConsole.ios",
            "V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/",
            12345678,
            {},
        ),
    )
    assert not parsed.badge_only


def test_content_names_and_sender_are_never_kept() -> None:
    secret = "I'm floating in a most peculiar way."
    parsed = parse(
        body(
            event_id=EVENT,
            sender="@major:tom.example",
            sender_display_name=secret,
            room_name=secret,
            room_alias="#secret:example.org",
            content={"body": secret},
        ),
        max_devices=100,
    )
    kept = repr(
        (parsed.event_id, parsed.room_id, parsed.unread, parsed.missed_calls, parsed.urgency)
    )
    assert secret not in kept and "major" not in kept and "#secret" not in kept
    assert not hasattr(parsed, "content") and not hasattr(parsed, "sender")


def test_a_notification_without_an_event_is_a_badge_update() -> None:
    # Synapse's badge update: {"id": "", "type": null, "sender": "", "counts": {...}}.
    parsed = parse(body(id="", type=None, sender="", counts={"unread": 0}), max_devices=100)
    assert parsed.badge_only
    assert (parsed.event_id, parsed.room_id, parsed.unread) == (None, None, 0)


@pytest.mark.parametrize(
    ("prio", "urgency"), [("high", "normal"), ("low", "low"), (None, "normal")]
)
def test_prio_becomes_an_urgency(prio: str | None, urgency: str) -> None:
    assert parse(body(event_id=EVENT, prio=prio), max_devices=1).urgency == urgency


def test_a_relaying_bothy_nodes_ids_are_read_as_ids() -> None:
    # A relay sends its hint's nid and thread id (SPEC section 14c): no sigil.
    parsed = parse(
        body(event_id="0190c0de-0000-7000-8000-000000000007", room_id="t1"), max_devices=1
    )
    assert (parsed.event_id, parsed.room_id) == ("0190c0de-0000-7000-8000-000000000007", "t1")


def test_a_device_listed_twice_is_one_device() -> None:
    other = {**DEVICE, "pushkey": "ffff"}
    parsed = parse(body(devices=[DEVICE, other, DEVICE]), max_devices=100)
    assert [d.pushkey for d in parsed.devices] == ["a1b2c3", "ffff"]


def test_the_repr_shows_no_id_or_pushkey() -> None:
    parsed = parse(body(event_id=EVENT, room_id=ROOM), max_devices=100)
    shown = repr(parsed) + repr(parsed.devices)
    assert EVENT not in shown and ROOM not in shown and "a1b2c3" not in shown


BAD: list[tuple[Any, str]] = [
    ([], "the body"),
    ({}, "notification"),
    ({"notification": []}, "notification"),
    (body(devices=[]), "notification.devices"),
    (body(devices={"app_id": "x"}), "notification.devices"),
    (body(devices=["x"]), "notification.devices[0]"),
    (body(devices=[{"pushkey": "k"}]), "notification.devices[0].app_id"),
    (body(devices=[{"app_id": "", "pushkey": "k"}]), "notification.devices[0].app_id"),
    (body(devices=[{"app_id": "a", "pushkey": 5}]), "notification.devices[0].pushkey"),
    (body(devices=[{"app_id": "a", "pushkey": ""}]), "notification.devices[0].pushkey"),
    (body(devices=[{"app_id": "a", "pushkey": "k" * 4097}]), "notification.devices[0].pushkey"),
    (
        body(devices=[{"app_id": "a", "pushkey": "k", "pushkey_ts": "1"}]),
        "notification.devices[0].pushkey_ts",
    ),
    (
        body(devices=[{"app_id": "a", "pushkey": "k", "pushkey_ts": -1}]),
        "notification.devices[0].pushkey_ts",
    ),
    (body(devices=[{"app_id": "a", "pushkey": "k", "data": []}]), "notification.devices[0].data"),
    (
        body(devices=[{"app_id": "a", "pushkey": "k", "tweaks": "x"}]),
        "notification.devices[0].tweaks",
    ),
    (body(event_id="$with space"), "notification.event_id"),
    (body(event_id="$" + "x" * 255), "notification.event_id"),
    (body(event_id="$événement"), "notification.event_id"),
    (body(event_id=7), "notification.event_id"),
    (body(room_id="!room\nname"), "notification.room_id"),
    (body(counts=[]), "notification.counts"),
    (body(counts={"unread": "2"}), "notification.counts.unread"),
    (body(counts={"unread": -1}), "notification.counts.unread"),
    (body(counts={"unread": 1.5}), "notification.counts.unread"),
    (body(counts={"unread": True}), "notification.counts.unread"),
    (body(counts={"missed_calls": "x"}), "notification.counts.missed_calls"),
    (body(prio="urgent"), "notification.prio"),
]


@pytest.mark.parametrize(("raw", "member"), BAD)
def test_a_malformed_body_is_refused_naming_the_member(raw: Any, member: str) -> None:
    with pytest.raises(BadNotification) as caught:
        parse(raw, max_devices=100)
    message = str(caught.value)
    assert message.split(":", maxsplit=1)[0] == member
    assert "with space" not in message and "événement" not in message


def test_more_devices_than_max_devices_are_refused() -> None:
    devices = [{**DEVICE, "pushkey": f"k{i}"} for i in range(3)]
    assert len(parse(body(devices=devices), max_devices=3).devices) == 3
    with pytest.raises(BadNotification, match="at most 2 devices"):
        parse(body(devices=devices), max_devices=2)


def test_the_answer_lists_each_rejected_pushkey_once_in_order() -> None:
    assert answer(["b", "a", "b"]) == {"rejected": ["b", "a"]}
    assert answer([]) == {"rejected": []}
