"""Quiet hours' schedule evaluation against the implementation it replaced (issue 30).

``quiet_at`` used to walk the chain of joined periods to answer a yes/no, resolving
every entry of two days at each step. The old functions are kept, as the
specification, in ``testkit/quiet.py`` (``bench/quiet.py`` times them too): on the
pathological schedules (14 entries back to back, every day, in zones with daylight
saving time, at both transitions) and on generated schedules, the yes/no and the
end time are those of the old code.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bothy_notify.notify.domain.quiet import DAYS, QuietEntry, QuietHours, quiet_at, quiet_until
from testkit.quiet import ALL_DAY, WEEK, back_to_back, old_quiet_until, wall_minutes

ACROSS_MIDNIGHT = back_to_back(22 * 60, 60)  # 22:00 to 12:00 the next day, hour by hour
IN_THE_GAP = back_to_back(60, 10)  # 01:00-03:20 in 10-minute steps: boundaries in both DST hours
WHOLE_DAYS = tuple(
    QuietEntry(WEEK, wall_minutes(m), wall_minutes(m)) for m in range(0, 14 * 97, 97)
)
WEEKDAYS = back_to_back(0, 24 * 60 // 14 + 1, frozenset({"mon", "tue", "wed", "thu", "fri"}))


def _u(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# (zone, schedule, now, quiet): Berlin springs forward at 2026-03-29 01:00 UTC and
# falls back at 2026-10-25 01:00 UTC; New York at 2026-03-08 07:00 and 2026-11-01 06:00.
PATHOLOGICAL = [
    ("Europe/Berlin", ALL_DAY, "2026-03-28T23:00:00+00:00", True),
    ("Europe/Berlin", ALL_DAY, "2026-03-29T00:59:30+00:00", True),
    ("Europe/Berlin", ALL_DAY, "2026-03-29T01:00:00+00:00", True),
    ("Europe/Berlin", ALL_DAY, "2026-10-25T00:30:00+00:00", True),
    ("Europe/Berlin", ALL_DAY, "2026-10-25T01:30:00+00:00", True),  # 02:30 the second time
    ("Europe/Berlin", ALL_DAY, "2026-06-10T12:00:00+00:00", True),
    ("Europe/Berlin", ACROSS_MIDNIGHT, "2026-03-28T21:30:00+00:00", True),
    ("Europe/Berlin", ACROSS_MIDNIGHT, "2026-03-29T10:30:00+00:00", False),  # 12:30 CEST
    ("Europe/Berlin", ACROSS_MIDNIGHT, "2026-10-25T01:59:00+00:00", True),
    ("Europe/Berlin", ACROSS_MIDNIGHT, "2026-10-25T11:00:00+00:00", False),
    ("Europe/Berlin", IN_THE_GAP, "2026-03-29T00:05:00+00:00", True),  # 01:05 CET
    ("Europe/Berlin", IN_THE_GAP, "2026-03-29T01:00:00+00:00", True),  # 03:00 CEST
    ("Europe/Berlin", IN_THE_GAP, "2026-03-29T01:20:00+00:00", False),  # 03:20 CEST
    ("Europe/Berlin", IN_THE_GAP, "2026-10-25T00:10:00+00:00", True),  # 02:10 CEST
    ("Europe/Berlin", IN_THE_GAP, "2026-10-25T01:10:00+00:00", True),  # 02:10 CET, again
    ("Europe/Berlin", IN_THE_GAP, "2026-10-25T02:30:00+00:00", False),  # 03:30 CET
    ("Europe/Berlin", WHOLE_DAYS, "2026-03-29T01:00:00+00:00", True),
    ("Europe/Berlin", WHOLE_DAYS, "2026-10-25T01:45:00+00:00", True),
    ("Europe/Berlin", WEEKDAYS, "2026-03-27T20:00:00+00:00", True),  # Friday evening
    ("Europe/Berlin", WEEKDAYS, "2026-03-29T01:00:00+00:00", False),  # Sunday
    ("Europe/Berlin", WEEKDAYS, "2026-10-26T00:30:00+00:00", True),  # Monday, just after
    ("America/New_York", ALL_DAY, "2026-03-08T06:59:00+00:00", True),
    ("America/New_York", ALL_DAY, "2026-03-08T07:00:00+00:00", True),
    ("America/New_York", ALL_DAY, "2026-11-01T05:30:00+00:00", True),
    ("America/New_York", ALL_DAY, "2026-11-01T06:30:00+00:00", True),  # 01:30 the second time
    ("America/New_York", IN_THE_GAP, "2026-03-08T07:00:00+00:00", True),
    ("America/New_York", IN_THE_GAP, "2026-11-01T06:40:00+00:00", True),
    ("America/New_York", WHOLE_DAYS, "2026-11-01T06:00:00+00:00", True),
    ("Australia/Lord_Howe", ALL_DAY, "2026-04-04T14:45:00+00:00", True),  # 30-minute change
    ("Australia/Lord_Howe", IN_THE_GAP, "2026-10-03T15:30:00+00:00", True),
]


@pytest.mark.parametrize(("zone", "schedule", "now", "quiet"), PATHOLOGICAL)
def test_pathological_schedules_answer_as_before(
    zone: str, schedule: tuple[QuietEntry, ...], now: str, quiet: bool
) -> None:
    hours = QuietHours(time_zone=zone, schedule=schedule)
    before = old_quiet_until(hours, _u(now))
    assert (before is not None) is quiet
    assert quiet_at(hours, _u(now)) is quiet
    assert quiet_until(hours, _u(now)) == before


def test_an_always_quiet_schedule_ends_where_the_old_chain_stopped() -> None:
    hours = QuietHours(time_zone="Europe/Berlin", schedule=ALL_DAY)
    now = _u("2026-03-28T23:00:00+00:00")
    end = quiet_until(hours, now)
    # 64 joined entries of 103 minutes after the one covering now (at most 4.6 days).
    assert end is not None and now < end <= now + timedelta(minutes=65 * 103)
    assert end == old_quiet_until(hours, now)


def test_an_entry_whose_end_equals_its_start_lasts_a_whole_day() -> None:
    hours = QuietHours(
        time_zone="Europe/Berlin",
        schedule=(QuietEntry(frozenset({"sat"}), time(0, 0), time(0, 0)),),
    )
    # Saturday 2026-03-28, all of it (wall clock), and not a minute of Sunday.
    assert not quiet_at(hours, _u("2026-03-27T23:59:00+01:00"))
    assert quiet_until(hours, _u("2026-03-28T00:00:00+01:00")) == _u("2026-03-29T00:00:00+01:00")
    assert quiet_at(hours, _u("2026-03-28T23:59:59+01:00"))
    assert not quiet_at(hours, _u("2026-03-29T00:00:00+01:00"))


# --- generated schedules -----------------------------------------------------------

ZONES = (
    "UTC",
    "Europe/Berlin",
    "Europe/London",
    "America/New_York",
    "America/St_Johns",  # -03:30 / -02:30
    "America/Santiago",  # changes at midnight
    "America/Havana",  # changes at midnight, back to 00:00
    "Australia/Lord_Howe",  # a 30-minute change
    "Australia/Sydney",  # the southern summer
    "Pacific/Chatham",  # +12:45 / +13:45
    "Africa/Casablanca",  # changes around Ramadan each year
)


@cache
def transitions(zone_name: str) -> tuple[datetime, ...]:
    """The instants of 2025-2027 at which ``zone_name``'s offset changes (to the hour)."""
    zone = ZoneInfo(zone_name)
    out = []
    at = datetime(2025, 1, 1, tzinfo=UTC)
    offset = at.astimezone(zone).utcoffset()
    while at.year < 2028:
        at += timedelta(minutes=15)
        now = at.astimezone(zone).utcoffset()
        if now != offset:
            out.append(at)
            offset = now
    return tuple(out)


INTERESTING = [0, 30, 59, 60, 90, 119, 120, 135, 150, 179, 180, 210, 1380, 1410, 1439]
clock = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 24 * 60 - 1)).map(wall_minutes)
entries = st.builds(
    QuietEntry,
    st.frozensets(st.sampled_from(DAYS), min_size=1),
    clock,
    clock,
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[QuietHours, datetime]:
    zone = draw(st.sampled_from(ZONES))
    near = transitions(zone)
    if len(near) > 0 and draw(st.booleans()):
        base = draw(st.sampled_from(near))
        now = base + timedelta(seconds=draw(st.integers(-2 * 86_400, 2 * 86_400)))
    else:
        now = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(
            seconds=draw(st.integers(0, 3 * 365 * 86_400))
        )
    schedule = tuple(draw(st.lists(entries, max_size=14)))
    snooze = draw(
        st.none() | st.integers(-86_400, 30 * 86_400).map(lambda s: now + timedelta(seconds=s))
    )
    return QuietHours(time_zone=zone, schedule=schedule, snooze_until=snooze), now


@settings(max_examples=400, deadline=None)
@given(cases())
def test_generated_schedules_answer_as_before(case: tuple[QuietHours, datetime]) -> None:
    hours, now = case
    before = old_quiet_until(hours, now)
    assert quiet_at(hours, now) is (before is not None)
    assert quiet_until(hours, now) == before


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(0, 14))
def test_back_to_back_schedules_answer_as_before(
    case: tuple[QuietHours, datetime], first_hour: int
) -> None:
    base, now = case
    hours = QuietHours(base.time_zone, back_to_back(first_hour * 60, 24 * 60 // 14 + 1))
    before = old_quiet_until(hours, now)
    assert quiet_at(hours, now) is (before is not None)
    assert quiet_until(hours, now) == before
