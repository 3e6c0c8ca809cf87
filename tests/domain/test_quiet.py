from datetime import UTC, datetime, time

import pytest

from bothy_notify.notify.domain.quiet import (
    DEFAULT,
    QuietEntry,
    QuietHours,
    QuietHoursInvalid,
    breaks_through,
    hold_until,
    parse_quiet_hours,
    quiet_from_doc,
    quiet_to_doc,
    quiet_until,
    summary_count,
    summary_decision,
)

WEEK = frozenset({"mon", "tue", "wed", "thu", "fri", "sat", "sun"})


def _u(s: str) -> datetime:
    return datetime.fromisoformat(s).astimezone(UTC)


def _h(zone: str, start: str, end: str, days: frozenset[str] = WEEK) -> QuietHours:
    return QuietHours(
        time_zone=zone,
        schedule=(QuietEntry(days, time.fromisoformat(start), time.fromisoformat(end)),),
    )


@pytest.mark.parametrize(
    ("zone", "start", "end", "now", "until"),
    [
        (
            "Europe/Berlin",
            "22:00",
            "07:00",
            "2026-06-01T23:00:00+02:00",
            "2026-06-02T07:00:00+02:00",
        ),
        ("Europe/Berlin", "22:00", "07:00", "2026-06-01T12:00:00+02:00", None),
        ("Europe/Berlin", "02:30", "06:00", "2026-03-29T00:59:00+00:00", None),
        (
            "Europe/Berlin",
            "02:30",
            "06:00",
            "2026-03-29T01:00:00+00:00",
            "2026-03-29T06:00:00+02:00",
        ),
        (
            "Europe/Berlin",
            "02:30",
            "04:00",
            "2026-10-25T00:30:00+00:00",
            "2026-10-25T04:00:00+01:00",
        ),
        ("Europe/Berlin", "02:30", "04:00", "2026-10-25T00:29:00+00:00", None),
        (
            "America/New_York",
            "02:15",
            "05:00",
            "2026-03-08T07:00:00+00:00",
            "2026-03-08T05:00:00-04:00",
        ),
        ("America/New_York", "02:15", "05:00", "2026-03-08T06:59:00+00:00", None),
        (
            "America/New_York",
            "01:30",
            "03:00",
            "2026-11-01T05:30:00+00:00",
            "2026-11-01T03:00:00-05:00",
        ),
        ("America/New_York", "01:30", "03:00", "2026-11-01T05:29:00+00:00", None),
    ],
)
def test_quiet_until_follows_wall_clock_across_dst(zone, start, end, now, until) -> None:
    assert quiet_until(_h(zone, start, end), _u(now)) == (None if until is None else _u(until))


def test_entry_crossing_midnight_belongs_to_its_start_day() -> None:
    hours = _h("Europe/Berlin", "22:00", "07:00", frozenset({"mon"}))
    assert quiet_until(hours, _u("2026-06-02T06:00:00+02:00")) == _u("2026-06-02T07:00:00+02:00")
    assert quiet_until(hours, _u("2026-06-02T23:00:00+02:00")) is None


def test_snooze_later_than_schedule_end_wins() -> None:
    base = _h("UTC", "22:00", "07:00")
    hours = QuietHours(base.time_zone, base.schedule, _u("2026-06-02T09:00:00+00:00"))
    assert quiet_until(hours, _u("2026-06-01T23:00:00+00:00")) == _u("2026-06-02T09:00:00+00:00")


def test_security_always_breaks_through() -> None:
    assert breaks_through(QuietHours(), "security")
    assert not breaks_through(QuietHours(), "mentions")
    assert breaks_through(QuietHours(breakthrough=frozenset({"mentions"})), "mentions")


NOW = _u("2026-06-01T12:00:00+00:00")
CATS = frozenset({"mentions", "security"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        (
            {"schedule": [{"days": ["mon", "xyz"], "start": "22:00", "end": "07:00"}]},
            "schedule.days",
        ),
        (
            {"schedule": [{"days": ["mon", "mon"], "start": "22:00", "end": "07:00"}]},
            "schedule.days",
        ),
        ({"schedule": [{"days": ["mon"], "start": "9:00", "end": "07:00"}]}, "schedule.start"),
        ({"schedule": [{"days": ["mon"], "start": "01:00", "end": "02:00"}] * 15}, "schedule"),
        ({"snooze_until": "2026-06-01T13:00:00"}, "snooze_until"),
        ({"snooze_until": "2026-06-31T13:00:00+00:00"}, "snooze_until"),
        ({"breakthrough": ["nope"]}, "breakthrough"),
    ],
)
def test_invalid_body_names_its_field(body, field) -> None:
    with pytest.raises(QuietHoursInvalid) as caught:
        parse_quiet_hours(body, NOW, CATS)
    assert caught.value.field == field


def test_empty_body_is_the_default() -> None:
    assert parse_quiet_hours({}, NOW, CATS) == QuietHours()


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("2026-07-01T12:00:00Z", "2026-07-01T12:00:00+00:00"),  # exactly 30 days: kept
        ("2026-07-02T13:00:00+00:00", "2026-07-01T12:00:00+00:00"),  # capped
        ("9999-12-31T23:59:59-23:59", "2026-07-01T12:00:00+00:00"),  # capped, no overflow
        ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00+00:00"),  # saturated, past
        ("2026-06-30T23:59:60Z", "2026-07-01T00:00:00+00:00"),  # a leap second
        ("2026-06-01t13:00:00.1234567890z", "2026-06-01T13:00:00.123456+00:00"),
    ],
)
def test_a_snooze_is_capped_at_30_days_and_saturated(value: str, stored: str) -> None:
    hours = parse_quiet_hours({"snooze_until": value}, NOW, CATS)
    assert hours.snooze_until == datetime.fromisoformat(stored)


def test_an_entry_whose_end_equals_its_start_is_accepted() -> None:
    body: dict[str, object] = {"schedule": [{"days": ["mon"], "start": "07:00", "end": "07:00"}]}
    hours = parse_quiet_hours(body, NOW, CATS)
    assert hours.schedule == (QuietEntry(frozenset({"mon"}), time(7), time(7)),)


NIGHTS = _h("Europe/Berlin", "22:00", "07:00")
NIGHT = _u("2026-06-01T23:00:00+02:00")
MORNING = _u("2026-06-02T07:00:00+02:00")


@pytest.mark.parametrize(
    ("hours", "category", "now", "held_until"),
    [
        (None, "messages", NIGHT, None),  # never set: never quiet
        (DEFAULT, "messages", NIGHT, None),
        (NIGHTS, "messages", NIGHT, MORNING),
        (NIGHTS, "messages", _u("2026-06-02T12:00:00+02:00"), None),  # not quiet
        (NIGHTS, "security", NIGHT, None),  # always through
        (
            QuietHours("Europe/Berlin", NIGHTS.schedule, None, frozenset({"mentions"})),
            "mentions",
            NIGHT,
            None,
        ),
        (
            QuietHours("Europe/Berlin", NIGHTS.schedule, None, frozenset({"mentions"})),
            "messages",
            NIGHT,
            MORNING,
        ),
        (
            QuietHours(snooze_until=_u("2026-06-01T21:30:00+00:00")),
            "social",
            NIGHT,
            _u("2026-06-01T21:30:00+00:00"),
        ),
    ],
)
def test_hold_until_is_the_end_of_the_period_or_none_to_send(
    hours: QuietHours | None, category: str, now: datetime, held_until: datetime | None
) -> None:
    assert hold_until(hours, category, now) == held_until


@pytest.mark.parametrize(
    ("held", "count", "decision"),
    [
        ([], 0, "nothing_unread"),
        ([("t1", 5, 4)], 1, "sent"),  # read up to 4 of 5: still unread
        ([("t1", 5, 5)], 0, "nothing_unread"),  # read up to the held message
        ([("t1", 5, 9)], 0, "nothing_unread"),  # read past it
        ([("t1", 5, None)], 0, "nothing_unread"),  # no longer readable: never mentioned
        ([(None, 0, None)], 1, "sent"),  # a hint without a thread is always mentioned
        ([("t1", 5, 4), ("t2", 3, 3), ("t3", 1, 0)], 2, "sent"),
    ],
)
def test_a_summary_counts_threads_still_unread_or_is_nothing(
    held: list[tuple[str | None, int, int | None]], count: int, decision: str
) -> None:
    assert summary_count(held) == count
    assert summary_decision(count) == decision


def test_a_stored_document_gives_back_the_same_settings() -> None:
    hours = parse_quiet_hours(
        {
            "time_zone": "America/New_York",
            "schedule": [{"days": ["sun", "mon"], "start": "21:15", "end": "06:45"}],
            "snooze_until": "2026-06-01T23:00:00+02:00",
            "breakthrough": ["mentions"],
        },
        NIGHT,
        frozenset({"mentions", "messages"}),
    )
    doc = quiet_to_doc(hours)
    assert doc == {
        "time_zone": "America/New_York",
        "schedule": [{"days": ["mon", "sun"], "start": "21:15", "end": "06:45"}],
        "snooze_until": "2026-06-01T21:00:00Z",
        "breakthrough": ["mentions"],
    }
    assert quiet_from_doc(doc) == hours
    assert quiet_to_doc(DEFAULT) == quiet_to_doc(quiet_from_doc({}))
