"""Quiet hours, do-not-disturb and snooze (issue 20): pure schedule logic.

No IO and no clock reads: ``now`` is an argument. Times are wall-clock in the
person's zone. An entry whose end is not after its start crosses midnight and
belongs to its start day; one whose end equals its start lasts 24 hours of wall
clock (``00:00``-``00:00`` is the whole day, as calendars mean it). A start or end
inside a skipped hour (spring forward) means the first valid instant after it; a
repeated hour (fall back) means its first occurrence.

Date arithmetic saturates: a ``snooze_until`` is capped at :data:`MAX_SNOOZE` after
``now``, and one before the earliest instant a ``datetime`` holds (year 1 with a
positive offset) is that instant, so no RFC 3339 value overflows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bothy_notify.kernel.results import Result

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


Periods = list[tuple[datetime, datetime]]


def _periods(hours: QuietHours, day: date, zone: ZoneInfo) -> Periods:
    """The periods of the entries that start on ``day``, as UTC instants."""
    out = []
    for entry in hours.schedule:
        if DAYS[day.weekday()] not in entry.days:
            continue
        end_day = day if entry.end > entry.start else day + timedelta(days=1)
        out.append((resolve_wall(day, entry.start, zone), resolve_wall(end_day, entry.end, zone)))
    return out


def _covering_end(
    hours: QuietHours, at: datetime, zone: ZoneInfo, periods: dict[date, Periods]
) -> datetime | None:
    """The latest end of the snooze and the periods covering ``at`` (``None``: none
    does). ``periods`` memoises each day's periods for the caller's walk."""
    best: datetime | None = None
    if hours.snooze_until is not None and at < hours.snooze_until:
        best = hours.snooze_until
    local = at.astimezone(zone).date()
    for day in (local - timedelta(days=1), local):
        found = periods.get(day)
        if found is None:
            found = periods[day] = _periods(hours, day, zone)
        for start, end in found:
            if start <= at < end and (best is None or end > best):
                best = end
    return best


def _covering(hours: QuietHours, local: datetime) -> Iterator[tuple[int, time]]:
    """The entries covering the wall-clock time ``local``, each as its end: (days after
    ``local``'s date, wall time). Exact outside a repeated hour's second pass
    (``local.fold == 0``): there an entry's start (or end) resolved to an instant is at
    or before the instant of ``local`` exactly when its wall time is at or before
    ``local``'s (a skipped wall time resolves to the first instant after the gap)."""
    wall = local.time()
    today = DAYS[local.weekday()]
    yesterday = DAYS[local.weekday() - 1]
    for entry in hours.schedule:
        if entry.end > entry.start:
            if entry.start <= wall < entry.end and today in entry.days:
                yield 0, entry.end
        else:  # crosses midnight: from today's start, or until yesterday's entry's end
            if entry.start <= wall and today in entry.days:
                yield 1, entry.end
            if wall < entry.end and yesterday in entry.days:
                yield 0, entry.end


def quiet_at(hours: QuietHours, now: datetime) -> bool:
    """Whether ``now`` is in quiet hours: snoozed, or an entry of the schedule covers it.

    Answered as soon as one entry covers ``now``, after one conversion of ``now`` to
    the person's wall clock, by comparing wall-clock times: the work is bounded by
    the number of entries, whatever the schedule. Only during the second pass
    through a repeated hour (fall back), where a wall time stands for two instants,
    are yesterday's and today's entries resolved to instants (entries x 2 days).
    The same answer as ``quiet_until(hours, now) is not None``.
    """
    if hours.snooze_until is not None and now < hours.snooze_until:
        return True
    if not hours.schedule:
        return False
    zone = ZoneInfo(hours.time_zone)
    local = now.astimezone(zone)
    if local.fold:
        return _covering_end(hours, now, zone, {}) is not None
    return next(_covering(hours, local), None) is not None


def _chain_end(
    hours: QuietHours, at: datetime, zone: ZoneInfo, periods: dict[date, Periods]
) -> datetime | None:
    """:func:`_covering_end`, resolving only the latest end of the covering entries
    (the resolution is monotonic) outside a repeated hour's second pass."""
    local = at.astimezone(zone)
    if local.fold:
        return _covering_end(hours, at, zone, periods)
    best: datetime | None = None
    if hours.snooze_until is not None and at < hours.snooze_until:
        best = hours.snooze_until
    latest = max(_covering(hours, local), default=None)
    if latest is not None:
        end = resolve_wall(local.date() + timedelta(days=latest[0]), latest[1], zone)
        if best is None or end > best:
            best = end
    return best


def quiet_until(hours: QuietHours, now: datetime) -> datetime | None:
    """The end of the quiet period covering ``now``, contiguous periods joined (at
    most ``_MAX_CHAIN`` of them); ``None`` when ``now`` is not quiet.

    Only where the end is needed (a held push's summary time): the yes/no is
    :func:`quiet_at`'s, checked first. Each step of the walk converts one instant and
    resolves one wall time (entries x 2 days within a repeated hour's second pass).
    """
    if not quiet_at(hours, now):
        return None
    zone = ZoneInfo(hours.time_zone)
    periods: dict[date, Periods] = {}
    end = _chain_end(hours, now, zone, periods)
    for _ in range(_MAX_CHAIN):
        if end is None:
            return None
        further = _chain_end(hours, end, zone, periods)
        if further is None or further <= end:
            return end
        end = further
    return end


def breaks_through(hours: QuietHours, category: str) -> bool:
    """Whether a push of ``category`` is sent while quiet (``security`` always is)."""
    return category in ALWAYS_THROUGH or category in hours.breakthrough


MAX_ENTRIES = 14
"""Entries of a schedule (two a day for a week)."""
MAX_SNOOZE = timedelta(days=30)
"""The furthest a snooze reaches from the moment it is set; a later one is capped."""
EARLIEST_INSTANT = datetime.min.replace(tzinfo=UTC)
"""The earliest instant a ``datetime`` holds: earlier values saturate to it."""
LATEST_INSTANT = datetime.max.replace(tzinfo=UTC)
"""The latest instant a ``datetime`` holds: later values saturate to it."""


class QuietHoursInvalid(ValueError):
    """A quiet-hours body that is not valid; ``field`` names the offending field."""

    def __init__(self, field_name: str) -> None:
        super().__init__(field_name)
        self.field = field_name


ZONES: frozenset[str] = frozenset(
    resources.files("tzdata").joinpath("zones").read_text(encoding="ascii").split()
)
"""The IANA names a person may choose: those of the ``tzdata`` package, so the set
does not depend on the host (the served API document lists them)."""


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})", re.ASCII
)
"""An RFC 3339 date-time (``T`` and ``Z`` in either case): ``fromisoformat`` alone also
takes times without seconds or offset, which the document's ``date-time`` does not."""


def saturating_add(at: datetime, delta: timedelta) -> datetime:
    """``at + delta``, saturated at :data:`EARLIEST_INSTANT` and :data:`LATEST_INSTANT`."""
    try:
        return at + delta
    except OverflowError:
        return LATEST_INSTANT if delta > timedelta(0) else EARLIEST_INSTANT


def saturating_utc(at: datetime) -> datetime:
    """The aware ``at`` in UTC, saturated where UTC leaves the years 1-9999 (year 1 with
    a positive offset, year 9999 with a negative one)."""
    try:
        return at.astimezone(UTC)
    except OverflowError:
        offset = at.utcoffset()
        return EARLIEST_INSTANT if offset is not None and offset > timedelta(0) else LATEST_INSTANT


def parse_rfc3339(value: object) -> datetime | None:
    """An RFC 3339 date-time as an aware ``datetime`` (a leap second, ``:60``, is the
    instant after ``:59``, saturated), or ``None`` when ``value`` is not one."""
    if not isinstance(value, str):
        return None
    match = _RFC3339.fullmatch(value.upper())
    if match is None:
        return None
    minute, second, fraction, offset = match.groups()
    leap = second == "60"
    text = f"{minute}:{'59' if leap else second}{(fraction or '')[:7]}{offset}"
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return saturating_add(at, timedelta(seconds=1)) if leap else at


def _snooze(value: object, now: datetime) -> datetime:
    snooze = parse_rfc3339(value)
    if snooze is None:
        raise QuietHoursInvalid("snooze_until")
    return saturating_utc(min(snooze, saturating_add(now, MAX_SNOOZE)))


def _hhmm(value: object, name: str) -> time:
    if not isinstance(value, str) or len(value) != 5 or value[2] != ":":
        raise QuietHoursInvalid(name)
    hh, mm = value[:2], value[3:]
    if not (_ascii_digits(hh) and _ascii_digits(mm)) or int(hh) > 23 or int(mm) > 59:
        raise QuietHoursInvalid(name)
    return time(int(hh), int(mm))


def parse_quiet_hours(
    body: dict[str, object], now: datetime, categories: frozenset[str]
) -> QuietHours:
    """The :class:`QuietHours` of a ``PUT /v1/quiet-hours`` body, or :class:`QuietHoursInvalid`."""
    zone = body.get("time_zone", "UTC")
    if not isinstance(zone, str) or zone not in ZONES:
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
        if not isinstance(item, dict) or set(item) - {"days", "start", "end"}:
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
        entries.append(QuietEntry(frozenset(days), start, end))
    snooze_raw = body.get("snooze_until")
    snooze = None if snooze_raw is None else _snooze(snooze_raw, now)
    through = body.get("breakthrough", [])
    if (
        not isinstance(through, list)
        or any(not isinstance(c, str) or c not in categories for c in through)
        or len(set(through)) != len(through)
    ):
        raise QuietHoursInvalid("breakthrough")
    return QuietHours(zone, tuple(entries), snooze, frozenset(through))


def hold_until(hours: QuietHours | None, category: str, now: datetime) -> datetime | None:
    """When a push of ``category`` due at ``now`` may go: ``None`` to send it now, else
    the end of the quiet period it is held for (quiet, and ``category`` does not
    break through)."""
    if hours is None or breaks_through(hours, category):
        return None
    return quiet_until(hours, now)


def summary_count(held: Iterable[tuple[str | None, int, int | None]]) -> int:
    """How many held items a quiet period's summary mentions: each is (thread or
    ``None``, the thread's last message when held, the read position now, ``None``
    when the person may no longer read it). A thread read up to that message, or
    no longer readable, is not mentioned; a hint without a thread always is."""
    count = 0
    for thread_id, seq, position in held:
        if thread_id is None or (position is not None and position < seq):
            count += 1
    return count


def summary_decision(count: int) -> Result:
    """``sent`` when something held is still unread, else ``nothing_unread`` (the
    label of ``bothy_quiet_summaries_total``): no push at all."""
    return Result.SENT if count > 0 else Result.NOTHING_UNREAD


def quiet_to_doc(hours: QuietHours) -> dict[str, Any]:
    """The settings as ``GET /v1/quiet-hours`` answers them and the store keeps them."""
    return {
        "time_zone": hours.time_zone,
        "schedule": [
            {
                "days": [d for d in DAYS if d in entry.days],
                "start": entry.start.strftime("%H:%M"),
                "end": entry.end.strftime("%H:%M"),
            }
            for entry in hours.schedule
        ],
        "snooze_until": None
        if hours.snooze_until is None
        else hours.snooze_until.isoformat().replace("+00:00", "Z"),
        "breakthrough": sorted(hours.breakthrough),
    }


def quiet_from_doc(doc: Mapping[str, Any]) -> QuietHours:
    """The settings of a stored document (written by :func:`quiet_to_doc`, so valid)."""
    snooze = doc.get("snooze_until")
    return QuietHours(
        time_zone=str(doc.get("time_zone", "UTC")),
        schedule=tuple(
            QuietEntry(
                frozenset(e["days"]), time.fromisoformat(e["start"]), time.fromisoformat(e["end"])
            )
            for e in doc.get("schedule", ())
        ),
        snooze_until=None if snooze is None else datetime.fromisoformat(snooze).astimezone(UTC),
        breakthrough=frozenset(doc.get("breakthrough", ())),
    )


DEFAULT = QuietHours()
"""A person who never set quiet hours: UTC, no schedule, no snooze, no breakthrough."""
