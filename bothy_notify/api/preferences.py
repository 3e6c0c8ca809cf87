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

Every handler acts for the token's own ``sub`` only.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import invalid, only_field
from bothy_notify.api.threads import thread_id_of
from bothy_notify.config import BUILTIN_CATEGORIES, Level
from bothy_notify.store import preferences as prefs
from bothy_notify.store import projections

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
    stored = await ctx.db.run(lambda c: prefs.follow_level(c, claims.user_id, thread_id))
    level = stored or ctx.config.notify.default_level.value
    return JSONResponse({"thread_id": thread_id, "level": level, "is_default": stored is None})


async def put_follow(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    thread_id = thread_id_of(request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    level = only_field(body, "level")
    if not isinstance(level, str) or level not in {lv.value for lv in Level}:
        raise invalid("level", "expected all, mentions or none")
    await ctx.db.run(
        lambda c: projections.set_follow(
            c, {"user_id": claims.user_id, "thread_id": thread_id, "level": level}
        )
    )
    return JSONResponse({"thread_id": thread_id, "level": level, "is_default": False})
