"""Quiet hours, do-not-disturb and snooze (issue 20): pure schedule logic.

No IO and no clock reads: ``now`` is an argument. Times are wall-clock in the
person's zone. An entry whose end is not after its start crosses midnight and
belongs to its start day. A start or end inside a skipped hour (spring forward)
means the first valid instant after it; a repeated hour (fall back) means its
first occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
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


ZONES: frozenset[str] = frozenset(
    resources.files("tzdata").joinpath("zones").read_text(encoding="ascii").split()
)
"""The IANA names a person may choose: those of the ``tzdata`` package, so the set
does not depend on the host (the served API document lists them)."""


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})", re.ASCII
)
"""An RFC 3339 date-time (``T`` and ``Z`` in either case): ``fromisoformat`` alone also
takes times without seconds or offset, which the document's ``date-time`` does not."""


def _snooze(value: object, now: datetime) -> datetime:
    if not isinstance(value, str) or _RFC3339.fullmatch(value.upper()) is None:
        raise QuietHoursInvalid("snooze_until")
    try:
        snooze = datetime.fromisoformat(value.upper())
    except ValueError as exc:
        raise QuietHoursInvalid("snooze_until") from exc
    if snooze - now > MAX_SNOOZE:
        raise QuietHoursInvalid("snooze_until")
    return snooze.astimezone(UTC)


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
        if start == end:
            raise QuietHoursInvalid("schedule.end")
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
