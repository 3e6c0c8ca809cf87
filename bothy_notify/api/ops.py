"""Operator endpoints: liveness, readiness, metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext


async def healthz(ctx: ApiContext, request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def readiness_checks(ctx: ApiContext, *, share: bool = True) -> dict[str, bool]:
    """The checks of ``/readyz``: the database's ping and every part of the node
    (``share``: see :meth:`~bothy_notify.store.db.Database.ping`)."""
    checks = {"database": await ctx.db.ping(share=share)}
    checks.update(ctx.readiness())
    return checks


async def readyz(ctx: ApiContext, request: Request) -> JSONResponse:
    checks = await readiness_checks(ctx)
    ready = all(checks.values())
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "checks": checks}
    cluster = ctx.cluster()
    if cluster is not None:
        body["cluster"] = cluster
    return JSONResponse(body, 200 if ready else 503)


async def metrics(ctx: ApiContext, request: Request) -> Response:
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
