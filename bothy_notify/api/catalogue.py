"""``GET /v1/catalogue``: the kind catalogue for devices.

Answers ``{"version", "kinds": {code: {"category", "template"?, "link"?}}}``
with ``ETag`` = the version; a request whose ``If-None-Match`` names the
current version gets ``304`` without a body. A device refreshes its copy when
a hint's ``mv`` differs from the version it holds.

Each request refreshes the catalogue first (in a worker thread: it lists the
kinds directory), so a kinds file added, changed or removed shows in the very
next answer, without a restart.
"""

from __future__ import annotations

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext, device_claims


async def get_catalogue(ctx: ApiContext, request: Request) -> Response:
    await device_claims(ctx, request)
    catalogue = await trio.to_thread.run_sync(ctx.catalogue.refresh)
    etag = f'"{catalogue.version}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    wanted = request.headers.get("if-none-match", "")
    if etag in (t.strip().removeprefix("W/") for t in wanted.split(",")) or wanted.strip() == "*":
        return Response(status_code=304, headers=headers)
    return JSONResponse(catalogue.to_json(), headers=headers)
