from datetime import UTC, datetime, time

import pytest

from bothy_notify.notify.domain.quiet import (
    QuietEntry,
    QuietHours,
    QuietHoursInvalid,
    breaks_through,
    parse_quiet_hours,
    quiet_until,
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
        ({"schedule": [{"days": ["mon"], "start": "07:00", "end": "07:00"}]}, "schedule.end"),
        ({"schedule": [{"days": ["mon"], "start": "01:00", "end": "02:00"}] * 15}, "schedule"),
        ({"snooze_until": "2026-06-01T13:00:00"}, "snooze_until"),
        ({"snooze_until": "2026-07-02T13:00:00+00:00"}, "snooze_until"),
        ({"breakthrough": ["nope"]}, "breakthrough"),
    ],
)
def test_invalid_body_names_its_field(body, field) -> None:
    with pytest.raises(QuietHoursInvalid) as caught:
        parse_quiet_hours(body, NOW, CATS)
    assert caught.value.field == field


def test_empty_body_is_the_default() -> None:
    assert parse_quiet_hours({}, NOW, CATS) == QuietHours()
