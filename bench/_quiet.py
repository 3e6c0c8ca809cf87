"""Quiet-hours settings the benchmarks store (issue 30): the pathological schedule,
a snooze, and writing either for a set of people.

The pathological schedule is the one that made ``quiet_at`` cost milliseconds:
14 entries back to back (103 minutes each, the last wrapping past midnight), every
day, in a zone with daylight saving time. Whoever has it is quiet all the time.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Json

PATHOLOGICAL_PEOPLE = 60
"""How many people of a benchmark get the pathological schedule (issue 30's figure)."""
_WEEK = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_LENGTH = 24 * 60 // 14 + 1  # minutes: 14 of them cover the day and wrap past midnight


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def pathological_doc() -> dict[str, Any]:
    """14 back-to-back entries every day in Europe/Berlin: quiet all the time."""
    schedule = [
        {"days": _WEEK, "start": _hhmm(i * _LENGTH), "end": _hhmm((i + 1) * _LENGTH)}
        for i in range(14)
    ]
    return {
        "time_zone": "Europe/Berlin",
        "schedule": schedule,
        "snooze_until": None,
        "breakthrough": [],
    }


def snooze_doc(now: datetime, hours: float = 1.0) -> dict[str, Any]:
    """Snoozed for ``hours`` from ``now``: quiet, at the cost of one comparison."""
    until = (now + timedelta(hours=hours)).astimezone(UTC).isoformat().replace("+00:00", "Z")
    return {"time_zone": "UTC", "schedule": [], "snooze_until": until, "breakthrough": []}


def store_quiet(cur: psycopg.Cursor[Any], docs: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Write each (person, settings) into ``bothy.quiet_hours``."""
    now = datetime.now(UTC)
    cur.executemany(
        "INSERT INTO bothy.quiet_hours (user_id, doc, updated_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (user_id) DO UPDATE SET doc = EXCLUDED.doc",
        [(user, Json(doc), now) for user, doc in docs],
    )
