"""``POST /_matrix/push/v1/notify``: the Matrix Push Gateway API (SPEC section 14c).

Served when ``[matrix_gateway]`` is configured (the route exists only then). No
token: a homeserver authenticates nothing to its push gateway (the spec has no
credentials); the gateway only pushes to pushkeys of its configured apps, each
request's work is bounded (``max_devices``) and every source address is held to
``requests_per_second`` (:mod:`bothy_notify.matrix.limits`).

Answers are the Matrix API's, not this API's ``{"error": ...}``:

=================================================  =================================
200 ``{"rejected": [...]}``                          served (:mod:`bothy_notify.matrix.gateway`)
400 ``{"errcode": "M_BAD_JSON", "error"}``           not JSON, or not a notification
                                                   (the message names the member)
413 ``M_TOO_LARGE``                                  a body over ``server.max_body_bytes``
429 ``M_LIMIT_EXCEEDED`` with ``retry_after_ms``     the source address is over its rate
503 ``M_UNKNOWN``                                    the database cannot be reached (the
                                                   homeserver retries)
=================================================  =================================

``bothy_matrix_requests_total{answer}`` counts them; the devices are counted by
the gateway.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from bothy_notify.api.context import ApiContext, read_json
from bothy_notify.api.errors import ApiError
from bothy_notify.matrix.limits import retry_after_ms
from bothy_notify.matrix.notification import BadNotification, answer, error, parse
from bothy_notify.store.db import StoreUnavailable

NOTIFY_PATH = "/_matrix/push/v1/notify"
_ERRCODES = {400: "M_BAD_JSON", 408: "M_UNKNOWN", 413: "M_TOO_LARGE"}


def _matrix_error(status: int, errcode: str, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({**error(errcode, message), **extra}, status)


async def post_notify(ctx: ApiContext, request: Request) -> JSONResponse:
    gateway = ctx.matrix
    count = ctx.metrics.matrix_requests
    if gateway is None:  # the route exists only with [matrix_gateway]
        return _matrix_error(404, "M_UNRECOGNIZED", "Unrecognized request")
    address = request.client.host if request.client is not None else ""
    wait = gateway.limits.take(address)
    if wait > 0:
        count.labels("rate_limited").inc()
        response = _matrix_error(
            429, "M_LIMIT_EXCEEDED", "too many requests", retry_after_ms=retry_after_ms(wait)
        )
        response.headers["Retry-After"] = str(max(1, round(wait)))
        return response
    try:
        body = await read_json(request, ctx.config.server.max_body_bytes)
        notification = parse(body, max_devices=gateway.config.max_devices)
    except ApiError as exc:
        count.labels("bad_json").inc()
        return _matrix_error(exc.status, _ERRCODES.get(exc.status, "M_UNKNOWN"), exc.message)
    except BadNotification as exc:
        count.labels("bad_json").inc()
        return _matrix_error(400, "M_BAD_JSON", str(exc))
    try:
        rejected = await gateway.notify(notification)
    except StoreUnavailable:
        count.labels("unavailable").inc()
        return _matrix_error(503, "M_UNKNOWN", "the service is unavailable; try again later")
    count.labels("ok").inc()
    return JSONResponse(answer(rejected))
