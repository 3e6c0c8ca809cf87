"""``POST /v1/events``: the producer's HTTP way into the event log.

A batch is all or nothing: every event is validated against its type's schema
first (422 naming the first bad field), then all are appended in one
transaction through ``bothy.append_event``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, producer_claims, read_json
from bothy_notify.api.errors import invalid, too_large
from bothy_notify.store import events as eventlog
from bothy_notify.store.events import EventRejected


async def post_events(ctx: ApiContext, request: Request) -> JSONResponse:
    producer_claims(ctx, request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    events = _events_of(ctx, body)
    try:
        seqs = await ctx.db.run(lambda c: eventlog.append(c, events))
    except EventRejected as exc:  # the database's own check; Python's ran first
        raise invalid(exc.field, exc.problem) from None
    ctx.metrics.events_appended.inc(len(seqs))
    return JSONResponse({"seqs": seqs})


def _events_of(ctx: ApiContext, body: Any) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(body, dict):
        raise invalid("(body)", "expected an object")
    unknown = sorted(k for k in body if k != "events")
    if unknown:
        raise invalid("(body)", "unknown field")
    raw = body.get("events")
    if not isinstance(raw, list):
        raise invalid("events", "expected an array")
    if not raw:
        raise invalid("events", "too few items")
    if len(raw) > ctx.config.server.max_batch_events:
        raise too_large("too many events in one batch (server.max_batch_events)")
    # App hints belong to the app's own categories (SPEC section 6), never a built-in one.
    categories = set(ctx.config.notify.categories)
    out: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(raw):
        where = f"events[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "expected an object")
        if set(item) - {"type", "payload"}:
            raise invalid(where, "unknown field")
        if "payload" not in item:
            raise invalid(f"{where}.payload", "required")
        try:
            ctx.validator.check(item.get("type"), item["payload"], where=f"{where}.")
        except EventRejected as exc:
            raise invalid(exc.field, exc.problem) from None
        payload = item["payload"]
        if item["type"] == "hint.requested" and payload["category"] not in categories:
            raise invalid(f"{where}.payload.category", "not a configured category")
        out.append((item["type"], payload))
    return out
