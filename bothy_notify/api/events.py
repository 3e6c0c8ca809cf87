"""``POST /v1/events``: the producer's HTTP way into the event log.

A batch is all or nothing: every event is validated against its type's schema
first (422 naming the first bad field), then all are appended in one
transaction through ``bothy.append_event``: one statement, which requests
arriving together share (:class:`~bothy_notify.store.appender.GroupAppender`,
each keeping its own answer).

Idempotency: with an ``Idempotency-Key`` header (1 to 255 characters of
``A-Z a-z 0-9 . _ : ~ + / = -``, optionally in double quotes as the IETF draft
writes it), a batch is appended once per producer (token ``sub``) and key
within ``server.idempotency_window``: a retry with the same key and the same
events answers the same ``{"seqs": [...]}`` (with ``Idempotent-Replayed:
true``) and appends nothing; the same key with other events is 409. Events
are compared as JSON values, so whitespace and key order do not matter.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, producer_claims, read_json
from bothy_notify.api.errors import ApiError, invalid
from bothy_notify.store import append_keys
from bothy_notify.store import events as eventlog
from bothy_notify.store.db import Conn
from bothy_notify.store.events import EventRejected

IDEMPOTENCY_HEADER = "idempotency-key"
_IDEMPOTENCY_KEY = re.compile(r'[A-Za-z0-9._:~+/=-]{1,255}|"[A-Za-z0-9._:~+/=-]{1,255}"')
"""The accepted form (a UUID, a ULID, a hex or base64 digest fit), bare or quoted."""


async def post_events(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = producer_claims(ctx, request)
    key = idempotency_key(request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    events = _events_of(ctx, body)

    def append(conn: Conn) -> list[int]:
        return eventlog.append(conn, events)

    replayed = False
    try:
        if key is None:
            seqs = await ctx.appender.append(events)
        else:
            digest, now = batch_digest(events), ctx.clock.now()
            window = ctx.config.server.idempotency_window
            once = await ctx.db.run(
                lambda c: append_keys.append_once(
                    c,
                    producer=claims.subject,
                    key=key,
                    digest=digest,
                    append=append,
                    now=now,
                    window=window,
                )
            )
            if once.conflict:
                raise ApiError(
                    409,
                    "idempotency_conflict",
                    "this Idempotency-Key was already used with a different batch",
                )
            seqs, replayed = once.seqs, once.replayed
    except EventRejected as exc:  # the database's own check; Python's ran first
        raise invalid(exc.field, exc.problem) from None
    if replayed:
        return JSONResponse({"seqs": seqs}, headers={"Idempotent-Replayed": "true"})
    ctx.metrics.events_appended.inc(len(seqs))
    return JSONResponse({"seqs": seqs})


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` without its quotes; 422 when malformed."""
    values = request.headers.getlist(IDEMPOTENCY_HEADER)
    if not values:
        return None
    if len(values) > 1 or not _IDEMPOTENCY_KEY.fullmatch(values[0]):
        raise invalid("Idempotency-Key", "does not have the required form")
    return values[0].strip('"')


def batch_digest(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    """SHA-256 of the batch as JSON values (key order and whitespace do not count)."""
    # ASCII escapes: a lone surrogate that JSON allows still encodes.
    canonical = json.dumps([[t, p] for t, p in events], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


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
        # The served document's maxItems: a body against the schema (422), not one too
        # large to read (413 is for bytes, server.max_body_bytes).
        raise invalid("events", "too many items (server.max_batch_events)")
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
