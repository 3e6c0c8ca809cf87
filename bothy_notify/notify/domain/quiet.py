"""Quiet hours, do-not-disturb and snooze (issue 20): pure schedule logic.

No IO and no clock reads: ``now`` is an argument. Times are wall-clock in the
person's zone. An entry whose end is not after its start crosses midnight and
belongs to its start day. A start or end inside a skipped hour (spring forward)
means the first valid instant after it; a repeated hour (fall back) means its
first occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALWAYS_THROUGH = frozenset({"security"})
_MAX_CHAIN = 64


@dataclass(frozen=True, slots=True)
class QuietEntry:
    days: frozenset[str]
    start: time
    end: time


@dataclass(frozen=True, slots=True)
class QuietHours:
    time_zone: str = "UTC"
    schedule: tuple[QuietEntry, ...] = ()
    snooze_until: datetime | None = None
    breakthrough: frozenset[str] = field(default_factory=frozenset)


def resolve_wall(day: date, at: time, zone: ZoneInfo) -> datetime:
    """The UTC instant of wall-clock ``day at`` in ``zone`` (gap: first valid after)."""
    naive = datetime.combine(day, at)
    first = naive.replace(tzinfo=zone, fold=0)
    utc = first.astimezone(UTC)
    if utc.astimezone(zone).replace(tzinfo=None) == naive:
        return utc
    # Inside a skipped hour: the first instant whose wall time is not before it.
    low = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    while low.astimezone(zone).replace(tzinfo=None) < naive and low < utc:
        low += timedelta(minutes=1)
    return low


def _periods(hours: QuietHours, day: date, zone: ZoneInfo) -> list[tuple[datetime, datetime]]:
    out = []
    for entry in hours.schedule:
        if DAYS[day.weekday()] not in entry.days:
            continue
        end_day = day if entry.end > entry.start else day + timedelta(days=1)
        out.append((resolve_wall(day, entry.start, zone), resolve_wall(end_day, entry.end, zone)))
    return out


def _covering_end(hours: QuietHours, at: datetime, zone: ZoneInfo) -> datetime | None:
    best: datetime | None = None
    if hours.snooze_until is not None and at < hours.snooze_until:
        best = hours.snooze_until
    local = at.astimezone(zone).date()
    for day in (local - timedelta(days=1), local):
        for start, end in _periods(hours, day, zone):
            if start <= at < end and (best is None or end > best):
                best = end
    return best


def quiet_until(hours: QuietHours, now: datetime) -> datetime | None:
    """The end of the quiet period covering ``now`` (contiguous periods joined); ``None``."""
    zone = ZoneInfo(hours.time_zone)
    end = _covering_end(hours, now, zone)
    for _ in range(_MAX_CHAIN):
        if end is None:
            return None
        further = _covering_end(hours, end, zone)
        if further is None or further <= end:
            return end
        end = further
    return end


def quiet_at(hours: QuietHours, now: datetime) -> bool:
    return quiet_until(hours, now) is not None


def breaks_through(hours: QuietHours, category: str) -> bool:
    """Whether a push of ``category`` is sent while quiet (``security`` always is)."""
    return category in ALWAYS_THROUGH or category in hours.breakthrough


MAX_ENTRIES = 14
MAX_SNOOZE = timedelta(days=30)


class QuietHoursInvalid(ValueError):
    """A quiet-hours body that is not valid; ``field`` names the offending field."""

    def __init__(self, field_name: str) -> None:
        super().__init__(field_name)
        self.field = field_name


def _hhmm(value: object, name: str) -> time:
    if not isinstance(value, str) or len(value) != 5 or value[2] != ":":
        raise QuietHoursInvalid(name)
    hh, mm = value[:2], value[3:]
    if not (hh.isdigit() and mm.isdigit()) or int(hh) > 23 or int(mm) > 59:
        raise QuietHoursInvalid(name)
    return time(int(hh), int(mm))


def parse_quiet_hours(
    body: dict[str, object], now: datetime, categories: frozenset[str]
) -> QuietHours:
    """The :class:`QuietHours` of a ``PUT /v1/quiet-hours`` body, or :class:`QuietHoursInvalid`."""
    zone = body.get("time_zone", "UTC")
    if not isinstance(zone, str):
        raise QuietHoursInvalid("time_zone")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise QuietHoursInvalid("time_zone") from exc
    raw = body.get("schedule", [])
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise QuietHoursInvalid("schedule")
    entries = []
    for item in raw:
        if not isinstance(item, dict):
            raise QuietHoursInvalid("schedule")
        days = item.get("days")
        if (
            not isinstance(days, list)
            or not days
            or any(d not in DAYS for d in days)
            or len(set(days)) != len(days)
        ):
            raise QuietHoursInvalid("schedule.days")
        start, end = (
            _hhmm(item.get("start"), "schedule.start"),
            _hhmm(item.get("end"), "schedule.end"),
        )
        if start == end:
            raise QuietHoursInvalid("schedule.end")
        entries.append(QuietEntry(frozenset(days), start, end))
    snooze_raw = body.get("snooze_until")
    snooze = None
    if snooze_raw is not None:
        if not isinstance(snooze_raw, str):
            raise QuietHoursInvalid("snooze_until")
        try:
            snooze = datetime.fromisoformat(snooze_raw)
        except ValueError as exc:
            raise QuietHoursInvalid("snooze_until") from exc
        if snooze.tzinfo is None or snooze - now > MAX_SNOOZE:
            raise QuietHoursInvalid("snooze_until")
        snooze = snooze.astimezone(UTC)
    through = body.get("breakthrough", [])
    if not isinstance(through, list) or any(c not in categories for c in through):
        raise QuietHoursInvalid("breakthrough")
    return QuietHours(zone, tuple(entries), snooze, frozenset(through))
