"""The operator's status page and its endpoints.

- ``GET /admin`` (with ``/admin/admin.css`` and ``/admin/admin.js``): one page,
  shipped in the package (``api/static/``), no CDN and no framework. It asks
  for a token once (kept in the tab's ``sessionStorage``) and reads
  ``GET /v1/admin/status`` every 2 s. The page itself needs no token: it
  holds no data.
- ``GET /v1/admin/status`` (scope ``admin:read``): aggregates only
  (:mod:`bothy_notify.api.status`).
- ``POST /v1/admin/dead-letters/retry`` and ``.../discard`` (scope
  ``admin:write``): replay dead letters decided with today's facts, as
  ``bothy-notify events retry`` does, or delete them (their events stay in the
  log); all of them, or those of one event type; at most
  :data:`MAX_PER_ACTION` per request (the answer says how many remain).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext, bearer, read_json
from bothy_notify.api.errors import ApiError, invalid
from bothy_notify.auth import ADMIN_READ, ADMIN_WRITE, AuthError
from bothy_notify.notify.replay import replay
from bothy_notify.store import status as store_status
from bothy_notify.store.db import Conn

log = logging.getLogger("bothy.api.admin")

MAX_PER_ACTION = 500
"""Dead letters one retry or discard request handles; the rest stay for the next."""
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
"""An event type as the log names them (``message.created``)."""
_ACTION_BODY_LIMIT = 1024

# Served with every part of the page: nothing but its own files runs or loads.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_FILES = {
    "admin.html": "text/html; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
    "admin.js": "text/javascript; charset=utf-8",
}


@cache
def _file(name: str) -> bytes:
    return resources.files("bothy_notify.api").joinpath("static", name).read_bytes()


def _static(name: str) -> Response:
    return Response(_file(name), media_type=_FILES[name], headers=_PAGE_HEADERS)


async def get_page(ctx: ApiContext, request: Request) -> Response:
    return _static("admin.html")


async def get_css(ctx: ApiContext, request: Request) -> Response:
    return _static("admin.css")


async def get_js(ctx: ApiContext, request: Request) -> Response:
    return _static("admin.js")


def operator_claims(ctx: ApiContext, request: Request, scope: str) -> None:
    """401 without a valid token, 403 without ``scope``."""
    try:
        ctx.verifier.operator(bearer(request), scope)
    except AuthError as exc:
        if exc.code == "forbidden":
            raise ApiError(403, "forbidden", f"the token lacks scope {scope}") from exc
        raise ApiError(401, "unauthorized", "the token is missing, invalid or expired") from exc


async def get_status(ctx: ApiContext, request: Request) -> JSONResponse:
    operator_claims(ctx, request, ADMIN_READ)
    if ctx.status is None:
        raise ApiError(404, "not_found", "no such endpoint")
    body = await ctx.status.status(ctx.db, ctx.clock.now())
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


async def _action_type(ctx: ApiContext, request: Request) -> str | None:
    body = await read_json(request, _ACTION_BODY_LIMIT)
    if not isinstance(body, dict):
        raise invalid("(body)", "expected an object")
    if set(body) - {"type"}:
        raise invalid("(body)", "unknown field")
    if "type" not in body:
        return None
    event_type = body["type"]
    if event_type is None:  # a member is a value or absent, never null
        raise invalid("type", "must not be null")
    if (
        not isinstance(event_type, str)
        or len(event_type) > 128
        or not _EVENT_TYPE.fullmatch(event_type)
    ):
        raise invalid("type", "not an event type")
    return event_type


async def post_retry(ctx: ApiContext, request: Request) -> JSONResponse:
    """Replay dead letters in log order, each decided with today's facts."""
    operator_claims(ctx, request, ADMIN_WRITE)
    event_type = await _action_type(ctx, request)
    now = ctx.clock.now()
    config = ctx.config

    def run(conn: Conn) -> dict[str, int]:
        replayed = failed = 0
        for seq in store_status.dead_letter_seqs(conn, event_type=event_type, limit=MAX_PER_ACTION):
            result = replay(conn, seq, config=config, now=now)
            if result.replayed:
                replayed += 1
            elif not result.gone:
                failed += 1
        remaining = store_status.count_dead_letters(conn, event_type=event_type)
        return {"replayed": replayed, "failed": failed, "remaining": remaining}

    answer = await _act(ctx, run)
    log.info("dead letters replayed by an operator", extra=answer)
    return JSONResponse(answer)


async def post_discard(ctx: ApiContext, request: Request) -> JSONResponse:
    """Delete dead letters: the round never decides them (their events stay in the log)."""
    operator_claims(ctx, request, ADMIN_WRITE)
    event_type = await _action_type(ctx, request)

    def run(conn: Conn) -> dict[str, int]:
        with conn.transaction():
            seqs = store_status.dead_letter_seqs(conn, event_type=event_type, limit=MAX_PER_ACTION)
            discarded = store_status.discard_dead_letters(conn, seqs)
            remaining = store_status.count_dead_letters(conn, event_type=event_type)
        return {"discarded": discarded, "remaining": remaining}

    answer = await _act(ctx, run)
    log.info("dead letters discarded by an operator", extra=answer)
    return JSONResponse(answer)


async def _act(ctx: ApiContext, run: Callable[[Conn], dict[str, int]]) -> dict[str, int]:
    try:
        answer: dict[str, int] = await ctx.db.run(run, transaction=False)
    finally:
        if ctx.status is not None:
            ctx.status.forget()
    return answer


__all__ = [
    "get_css",
    "get_js",
    "get_page",
    "get_status",
    "post_discard",
    "post_retry",
]
