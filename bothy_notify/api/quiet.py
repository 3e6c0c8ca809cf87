"""``GET``/``PUT /v1/quiet-hours``: the calling person's quiet hours (issue 20).

Both answer ``{"time_zone", "schedule": [{"days", "start", "end"}],
"snooze_until", "breakthrough"}``; a person who never set any has the default
(UTC, no schedule, no snooze, no breakthrough), and a snooze that has ended reads
as ``null``; one more than 30 days ahead is capped there and reads capped.
``PUT`` replaces the whole settings (a field left out takes its default, so
``{}`` clears them) and answers 422 naming the first field that is wrong
(:func:`~bothy_notify.notify.domain.quiet.parse_quiet_hours`), storing nothing.
A change during a quiet period that held pushes moves the period's summary to
the new end: now, when the person is no longer quiet.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import invalid
from bothy_notify.api.preferences import known_categories
from bothy_notify.notify.domain.quiet import (
    DEFAULT,
    QuietHours,
    QuietHoursInvalid,
    parse_quiet_hours,
    quiet_from_doc,
    quiet_to_doc,
    quiet_until,
)
from bothy_notify.store import quiet as quiet_store
from bothy_notify.store.db import Conn

FIELDS = frozenset({"time_zone", "schedule", "snooze_until", "breakthrough"})

PROBLEMS = {
    "time_zone": "expected an IANA time zone name",
    "schedule": "expected a list of at most 14 entries",
    "schedule.days": "expected distinct days of mon, tue, wed, thu, fri, sat, sun",
    "schedule.start": "expected HH:MM",
    "schedule.end": "expected HH:MM",
    "snooze_until": "expected an RFC 3339 time with an offset",
    "breakthrough": "expected a list of configured categories",
}
"""The constant problem of each field :class:`QuietHoursInvalid` can name."""


def _answer(hours: QuietHours, now: datetime) -> JSONResponse:
    doc = quiet_to_doc(hours)
    if hours.snooze_until is not None and hours.snooze_until <= now:
        doc["snooze_until"] = None
    return JSONResponse(doc)


async def get_quiet_hours(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    doc = await ctx.db.run(lambda c: quiet_store.doc_of(c, claims.user_id), transaction=False)
    return _answer(DEFAULT if doc is None else quiet_from_doc(doc), ctx.clock.now())


async def put_quiet_hours(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    now = ctx.clock.now()
    hours = parse_body(body, now, frozenset(known_categories(ctx)))
    user_id = claims.user_id

    def store(conn: Conn) -> None:
        pending = quiet_store.save(conn, user_id, quiet_to_doc(hours), now)
        if pending is not None:
            quiet_store.move_summary(conn, pending, quiet_until(hours, now) or now)

    await ctx.db.run(store)
    return _answer(hours, now)


def parse_body(body: Any, now: datetime, categories: frozenset[str]) -> QuietHours:
    """The settings of a ``PUT`` body, or the 422 naming its first wrong field."""
    if not isinstance(body, dict):
        raise invalid("(body)", "expected an object")
    if set(body) - FIELDS:
        raise invalid("(body)", "unknown field")
    try:
        return parse_quiet_hours(body, now, categories)
    except QuietHoursInvalid as exc:
        raise invalid(exc.field, PROBLEMS[exc.field]) from None
