"""Per-thread settings of the calling person: the read position.

A thread the person cannot read (or that does not exist) answers 404 with
the same constant message either way, and nothing is stored: a device learns
nothing about threads it cannot read, and cannot fill the tables with rows
for made-up threads.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import invalid, only_field, thread_not_found
from bothy_notify.store import access, marks, projections
from bothy_notify.store.db import Conn

MAX_SEQ = 9_007_199_254_740_991
"""Largest sequence a JavaScript client can hold exactly (2**53 - 1)."""


def thread_id_of(request: Request) -> str:
    """The path's thread id; the binding (:mod:`bothy_notify.api.app`) answered one
    of another form with 404 before the handler ran."""
    return str(request.path_params["thread_id"])


async def put_read(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    thread_id = thread_id_of(request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    seq = only_field(body, "seq")
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise invalid("seq", "expected an integer from 0")
    position = {
        "user_id": claims.user_id,
        "thread_id": thread_id,
        "seq": seq,
        "device_id": claims.device_id,
    }
    clearing = marks.clearing_of(ctx.config.push, ctx.clock.now())
    stored = await ctx.db.run(partial(_mark_read_if_readable, position=position, clearing=clearing))
    if stored is None:
        raise thread_not_found()
    return JSONResponse({"thread_id": thread_id, "last_read_seq": stored})


def _mark_read_if_readable(
    conn: Conn, *, position: dict[str, Any], clearing: marks.Clearing | None
) -> int | None:
    """The stored position after moving it, or ``None`` (nothing stored) when the
    thread is not readable by the person."""
    user_id, thread_id = position["user_id"], position["thread_id"]
    if not access.may_read(conn, user_id=user_id, thread_id=thread_id):
        return None
    return projections.mark_read(conn, position, clearing)
