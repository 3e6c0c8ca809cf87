"""Per-thread settings of the calling person: the read position."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import invalid, only_field
from bothy_notify.kernel.ids import is_valid_id
from bothy_notify.store import projections

MAX_SEQ = 9_007_199_254_740_991
"""Largest sequence a JavaScript client can hold exactly (2**53 - 1)."""


def thread_id_of(request: Request) -> str:
    thread_id = request.path_params["thread_id"]
    if not is_valid_id(thread_id):
        raise invalid("thread_id", "does not have the required form")
    return str(thread_id)


async def put_read(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    thread_id = thread_id_of(request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    seq = only_field(body, "seq")
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise invalid("seq", "expected an integer from 0")
    stored = await ctx.db.run(
        lambda c: projections.mark_read(
            c, {"user_id": claims.user_id, "thread_id": thread_id, "seq": seq}
        )
    )
    return JSONResponse({"thread_id": thread_id, "last_read_seq": stored})
