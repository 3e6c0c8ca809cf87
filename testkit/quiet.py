"""Quiet hours' evaluation as it was before issue 30: the specification that the
current one (``bothy_notify.notify.domain.quiet``) is tested against
(``tests/domain/test_quiet_schedules.py``) and timed against (``bench/quiet.py``),
and the pathological schedule both use: 14 entries back to back, every day.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from bothy_notify.notify.domain.quiet import DAYS, QuietEntry, QuietHours

# --- the old implementation (before issue 30), verbatim but for names ---------

_OLD_MAX_CHAIN = 64


def _old_resolve_wall(day: date, at: time, zone: ZoneInfo) -> datetime:
    naive = datetime.combine(day, at)
    first = naive.replace(tzinfo=zone, fold=0)
    utc = first.astimezone(UTC)
    if utc.astimezone(zone).replace(tzinfo=None) == naive:
        return utc
    low = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    while low.astimezone(zone).replace(tzinfo=None) < naive and low < utc:
        low += timedelta(minutes=1)
    return low


def _old_periods(hours: QuietHours, day: date, zone: ZoneInfo) -> list[tuple[datetime, datetime]]:
    out = []
    for entry in hours.schedule:
        if DAYS[day.weekday()] not in entry.days:
            continue
        end_day = day if entry.end > entry.start else day + timedelta(days=1)
        out.append(
            (_old_resolve_wall(day, entry.start, zone), _old_resolve_wall(end_day, entry.end, zone))
        )
    return out


def _old_covering_end(hours: QuietHours, at: datetime, zone: ZoneInfo) -> datetime | None:
    best: datetime | None = None
    if hours.snooze_until is not None and at < hours.snooze_until:
        best = hours.snooze_until
    local = at.astimezone(zone).date()
    for day in (local - timedelta(days=1), local):
        for start, end in _old_periods(hours, day, zone):
            if start <= at < end and (best is None or end > best):
                best = end
    return best


def old_quiet_until(hours: QuietHours, now: datetime) -> datetime | None:
    zone = ZoneInfo(hours.time_zone)
    end = _old_covering_end(hours, now, zone)
    for _ in range(_OLD_MAX_CHAIN):
        if end is None:
            return None
        further = _old_covering_end(hours, end, zone)
        if further is None or further <= end:
            return end
        end = further
    return end


# --- the pathological schedules ----------------------------------------------------

WEEK = frozenset(DAYS)


def wall_minutes(m: int) -> time:
    """``m`` minutes after midnight as a wall-clock time (wrapping past 24 h)."""
    return time(m // 60 % 24, m % 60)


def back_to_back(first: int, length: int, days: frozenset[str] = WEEK) -> tuple[QuietEntry, ...]:
    """14 entries of ``length`` minutes each, the first starting ``first`` minutes
    after midnight, each starting where the one before ended."""
    return tuple(
        QuietEntry(days, wall_minutes(first + i * length), wall_minutes(first + (i + 1) * length))
        for i in range(14)
    )


ALL_DAY = back_to_back(0, 24 * 60 // 14 + 1)  # 14 x 103 min: wraps past midnight, always quiet


__all__ = ["ALL_DAY", "WEEK", "back_to_back", "old_quiet_until", "wall_minutes"]
