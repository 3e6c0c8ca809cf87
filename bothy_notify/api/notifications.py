"""``GET /v1/notifications/unread``: the calling person's unread threads and badge.

Answers ``{"badge", "threads": [{"thread_id", "unread", "last_read_seq"}],
"truncated"?}``: the set the gateway's ``unread`` op lists
(:mod:`bothy_notify.store.unread`), ordered by thread id, at most
:data:`~bothy_notify.store.unread.UNREAD_LISTING_MAX` threads (``truncated``
beyond; ``badge`` still counts all of them, as a push's badge does: the cut is
the statement's ``LIMIT`` and the badge its count). iOS throttles
background pushes, so a phone's app (or its notification service extension) calls
this at start and on each push to drop what was read elsewhere (docs/clients.md).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, device_claims
from bothy_notify.store.db import Conn
from bothy_notify.store.unread import UNREAD_LISTING_MAX, UnreadThread, unread_listing


async def get_unread(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    user_id = claims.user_id

    def read(conn: Conn) -> tuple[int, list[UnreadThread]]:
        return unread_listing(conn, user_id, UNREAD_LISTING_MAX)

    badge, threads = await ctx.db.run(read, transaction=False)
    body: dict[str, Any] = {
        "badge": badge,
        "threads": [
            {"thread_id": t.thread_id, "unread": t.unread, "last_read_seq": t.last_read_seq}
            for t in threads
        ],
    }
    if badge > len(threads):
        body["truncated"] = True
    return JSONResponse(body)
