"""What the calling person wants to hear about: categories and follow levels.

- ``GET /v1/preferences`` answers ``{"categories": {name: bool}}`` for the
  built-in categories and those of ``notify.categories``; a person who never
  chose has everything on. ``security`` is always on.
- ``PUT /v1/preferences`` ``{"categories": {name: bool}}`` sets the named
  switches and keeps the others (a device that knows fewer categories never
  resets the rest); answers like ``GET``. Switching ``security`` off or naming
  an unknown category is refused with 422 and changes nothing.
- ``GET /v1/threads/{thread_id}/follow`` answers the effective level
  (``notify.default_level`` when none is stored) and whether it is that default.
- ``PUT /v1/threads/{thread_id}/follow`` ``{"level": "all"|"mentions"|"none"}``
  stores it through the ``thread.followed`` projection.
- Both answer 404 (one constant message) for a thread the person cannot read
  or that does not exist, and store nothing.

Every handler acts for the token's own ``sub`` only.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import invalid, only_field, thread_not_found
from bothy_notify.api.threads import thread_id_of
from bothy_notify.config import BUILTIN_CATEGORIES, Level
from bothy_notify.store import access, projections
from bothy_notify.store import preferences as prefs
from bothy_notify.store.db import Conn

ALWAYS_ON = frozenset({"security"})
"""Categories a person cannot switch off (SPEC section 6)."""


def known_categories(ctx: ApiContext) -> tuple[str, ...]:
    """Built-in categories first, then ``notify.categories`` in configured order."""
    return tuple(dict.fromkeys((*BUILTIN_CATEGORIES, *ctx.config.notify.categories)))


def _answer(ctx: ApiContext, stored: dict[str, bool]) -> JSONResponse:
    switches = {name: name in ALWAYS_ON or stored.get(name, True) for name in known_categories(ctx)}
    return JSONResponse({"categories": switches})


async def get_preferences(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    stored = await ctx.db.run(lambda c: prefs.categories(c, claims.user_id))
    return _answer(ctx, stored)


async def put_preferences(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    changes = _category_changes(ctx, body)
    stored = await ctx.db.run(lambda c: prefs.update_categories(c, claims.user_id, changes))
    return _answer(ctx, stored)


def _category_changes(ctx: ApiContext, body: Any) -> dict[str, bool]:
    raw = only_field(body, "categories")
    if not isinstance(raw, dict):
        raise invalid("categories", "expected an object")
    known = set(known_categories(ctx))
    changes: dict[str, bool] = {}
    for name, value in raw.items():
        if name not in known:
            raise invalid("categories", "unknown category")
        if not isinstance(value, bool):
            raise invalid(f"categories.{name}", "expected true or false")
        if name in ALWAYS_ON:
            if not value:
                raise invalid(f"categories.{name}", "cannot be switched off")
            continue
        changes[name] = value
    return changes


async def get_follow(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    thread_id = thread_id_of(request)
    readable, stored = await ctx.db.run(
        partial(_follow_level_if_readable, user_id=claims.user_id, thread_id=thread_id),
        transaction=False,  # two reads, each standing alone
    )
    if not readable:
        raise thread_not_found()
    level = stored or ctx.config.notify.default_level.value
    return JSONResponse({"thread_id": thread_id, "level": level, "is_default": stored is None})


async def put_follow(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    thread_id = thread_id_of(request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    level = only_field(body, "level")
    if not isinstance(level, str) or level not in {lv.value for lv in Level}:
        raise invalid("level", "expected all, mentions or none")
    follow = {"user_id": claims.user_id, "thread_id": thread_id, "level": level}
    if not await ctx.db.run(partial(_set_follow_if_readable, follow=follow)):
        raise thread_not_found()
    return JSONResponse({"thread_id": thread_id, "level": level, "is_default": False})


def _follow_level_if_readable(
    conn: Conn, *, user_id: str, thread_id: str
) -> tuple[bool, str | None]:
    if not access.may_read(conn, user_id=user_id, thread_id=thread_id):
        return False, None
    return True, prefs.follow_level(conn, user_id, thread_id)


def _set_follow_if_readable(conn: Conn, *, follow: dict[str, Any]) -> bool:
    """Store the level unless the person cannot read the thread; whether it was stored."""
    if not access.may_read(conn, user_id=follow["user_id"], thread_id=follow["thread_id"]):
        return False
    projections.set_follow(conn, follow)
    return True
