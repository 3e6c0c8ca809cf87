"""The Starlette application and how it is served on Trio (Hypercorn).

Every error leaves as ``{"error": {"code", "message"}}``; an unexpected
exception is logged (without request data) and answered 500. A database that
cannot be reached (:class:`~bothy_notify.store.db.StoreUnavailable`, from any
handler) is answered 503 ``unavailable`` with ``Retry-After``, here and nowhere
else; the process stays up and answers again once the database is back.

Path parameters are checked here, for every route, before the handler runs
and so before any store call: each one named in a route's path has its form
in :data:`PATH_PARAMETERS`, and a value of another form (NUL, invalid UTF-8,
5,000 characters, ``../``) names nothing that can exist. Such a request is
answered once its bearer token is verified (signature and time, which read
nothing; a missing or bad token is 401 as everywhere): 204 for a DELETE
(SPEC: a DELETE answers 204 when there is nothing to delete), else 404. A
route whose path names a parameter without a form is refused when the app is
built.

The Matrix notify route (:data:`DIRECT_ROUTES`) is served without Starlette's
middleware and router (:class:`_Api`): a homeserver's request goes straight to its
handler, answered and protected as every route is (path, errors, 500 on the
unexpected), with none of the per-request layers it does not use.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bothy_notify.api import (
    admin,
    catalogue,
    document,
    events,
    matrix,
    notifications,
    ops,
    preferences,
    quiet,
    recipients,
    registrations,
    threads,
)
from bothy_notify.api.context import BODY_DEADLINE, ApiContext, bearer
from bothy_notify.api.errors import ApiError, error_response, thread_not_found, unavailable
from bothy_notify.auth import AuthError
from bothy_notify.kernel.ids import DAEMON_ID_PATTERN, ID_PATTERN
from bothy_notify.kernel.sockets import bind_shared
from bothy_notify.store.db import StoreUnavailable

log = logging.getLogger("bothy.api")

Handler = Callable[[ApiContext, Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class PathParameter:
    """The form of a path parameter, and the answer to a value of another form
    (a GET or PUT; a DELETE answers 204)."""

    form: re.Pattern[str]
    not_found: Callable[[], ApiError]

    def fits(self, value: object) -> bool:
        return isinstance(value, str) and self.form.fullmatch(value) is not None


PATH_PARAMETERS: dict[str, PathParameter] = {
    "registration_id": PathParameter(
        re.compile(DAEMON_ID_PATTERN),
        lambda: ApiError(404, "not_found", "no such registration"),
    ),
    "thread_id": PathParameter(re.compile(ID_PATTERN), thread_not_found),
}
"""Every path parameter a route may name, by name (SPEC section 7: app IDs are 1 to
128 characters of ``[A-Za-z0-9._:-]``; registration ids are the daemon's UUIDs)."""


def _bad_path_parameter(ctx: ApiContext, request: Request, method: str) -> Response | None:
    """The answer when a path parameter is not of its form, else ``None``.

    Raises:
        ApiError: 401 when the request has no valid token.
    """
    for name, value in request.path_params.items():
        parameter = PATH_PARAMETERS[name]
        if not parameter.fits(value):
            try:
                ctx.verifier.decode(bearer(request))
            except AuthError:
                raise ApiError(
                    401, "unauthorized", "the token is missing, invalid or expired"
                ) from None
            if method == "DELETE":
                return Response(status_code=204)
            return parameter.not_found().response()
    return None


def _bind(
    ctx: ApiContext, handlers: dict[str, Handler]
) -> Callable[[Request], Awaitable[Response]]:
    """One endpoint for every method of a path, so a 405 lists all of them in ``Allow``."""

    body_timeout = ctx.config.server.body_timeout.total_seconds()

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        request.scope[BODY_DEADLINE] = trio.current_time() + body_timeout
        try:
            refused = _bad_path_parameter(ctx, request, method)
            if refused is not None:
                return refused
            return await handlers[method](ctx, request)
        except StoreUnavailable:
            return unavailable()
        except ApiError as exc:
            response = exc.response()
            if exc.status in (408, 413) and request.scope.get("http_version", "1.1")[0] == "1":
                # The rest of the body may still be on its way; a reused HTTP/1
                # connection would stall behind it, so this one ends here.
                response.headers["Connection"] = "close"
            return response

    endpoint.__name__ = "_".join(fn.__name__ for fn in handlers.values())
    return endpoint


DEVICE_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/v1/registrations", registrations.post_registration, ["POST"]),
    ("/v1/registrations", registrations.list_registrations, ["GET"]),
    ("/v1/registrations/{registration_id}", registrations.delete_registration, ["DELETE"]),
    ("/v1/threads/{thread_id}/read", threads.put_read, ["PUT"]),
    ("/v1/threads/{thread_id}/follow", preferences.get_follow, ["GET"]),
    ("/v1/threads/{thread_id}/follow", preferences.put_follow, ["PUT"]),
    ("/v1/preferences", preferences.get_preferences, ["GET"]),
    ("/v1/preferences", preferences.put_preferences, ["PUT"]),
    ("/v1/catalogue", catalogue.get_catalogue, ["GET"]),
    ("/v1/notifications/unread", notifications.get_unread, ["GET"]),
    ("/v1/quiet-hours", quiet.get_quiet_hours, ["GET"]),
    ("/v1/quiet-hours", quiet.put_quiet_hours, ["PUT"]),
    ("/v1/webpush/key", registrations.get_webpush_key, ["GET"]),
]
PRODUCER_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/v1/events", events.post_events, ["POST"]),
]
DOCUMENT_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/v1/openapi.json", document.get_openapi, ["GET"]),
]
"""The API document with this server's enumerations (no token)."""
TOPIC_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/v1/recipients/register", recipients.post_register, ["POST"]),
    ("/v1/recipients/unregister", recipients.post_unregister, ["POST"]),
    ("/v1/recipients/subscriptions", recipients.post_subscriptions, ["POST"]),
]
"""Topic mode (docs/topics.md): a device or a producer token, and the recipient's secret."""
ADMIN_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/admin", admin.get_page, ["GET"]),
    ("/admin/admin.css", admin.get_css, ["GET"]),
    ("/admin/admin.js", admin.get_js, ["GET"]),
    ("/v1/admin/status", admin.get_status, ["GET"]),
    ("/v1/admin/dead-letters/retry", admin.post_retry, ["POST"]),
    ("/v1/admin/dead-letters/discard", admin.post_discard, ["POST"]),
]
"""The operator's status page (docs/operations.md): tokens of scope admin:read / admin:write."""
MATRIX_ROUTES: list[tuple[str, Handler, list[str]]] = [
    (matrix.NOTIFY_PATH, matrix.post_notify, ["POST"]),
]
"""The Matrix Push Gateway API (404 ``M_UNRECOGNIZED`` unless ``[matrix_gateway]``)."""
DIRECT_ROUTES = frozenset({(matrix.NOTIFY_PATH, "POST")})
"""Routes :class:`_Api` serves itself, without Starlette's middleware and router: the
hot ones whose handlers use nothing of them (no path parameters, no token, no
``HTTPException``)."""
OPERATOR_ROUTES: list[tuple[str, Handler, list[str]]] = [
    ("/healthz", ops.healthz, ["GET"]),
    ("/readyz", ops.readyz, ["GET"]),
    ("/metrics", ops.metrics, ["GET"]),
]


ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class _Api(Starlette):
    """The app: Starlette, but the requests of ``direct`` (path -> endpoint, ``POST``)
    go straight to their endpoint, skipping the middleware stack (the server-error
    and exception layers) and the router's match over every route. What those
    layers would do for such a request is done here: an unexpected exception is
    answered by ``server_error`` (500, logged without request data)."""

    def __init__(
        self,
        *,
        direct: dict[str, Callable[[Request], Awaitable[Response]]],
        server_error: ErrorHandler,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._direct = direct
        self._server_error = server_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self._direct.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if endpoint is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            response = await self._server_error(request, exc)
        await response(scope, receive, send)


def build_app(
    ctx: ApiContext,
    *,
    operator_only: bool = False,
    extra_routes: list[tuple[str, Handler, list[str]]] | None = None,
    direct: frozenset[tuple[str, str]] = DIRECT_ROUTES,
) -> Starlette:
    """The ASGI app. ``operator_only`` (role ``worker``) serves just health and metrics;
    the ``(path, method)`` routes of ``direct`` (``POST`` only) skip Starlette's layers."""
    table = list(OPERATOR_ROUTES)
    if not operator_only:
        table = (
            DEVICE_ROUTES
            + PRODUCER_ROUTES
            + TOPIC_ROUTES
            + ADMIN_ROUTES
            + DOCUMENT_ROUTES
            + MATRIX_ROUTES
            + (extra_routes or [])
            + table
        )
    by_path: dict[str, dict[str, Handler]] = {}
    for path, fn, methods in table:
        for method in methods:
            by_path.setdefault(path, {})[method] = fn
    routes = [
        Route(path, _bind(ctx, handlers), methods=list(handlers))
        for path, handlers in by_path.items()
    ]
    served_directly = {
        path: _bind(ctx, {method: handlers[method]})
        for path, handlers in by_path.items()
        for method in handlers
        if (path, method) in direct and method == "POST"
    }
    if any("{" in path for path in served_directly):
        raise ValueError("a route served directly names no path parameter (none is checked)")
    for route in routes:
        unknown = set(route.param_convertors) - set(PATH_PARAMETERS)
        if unknown:
            raise ValueError(
                f"route {route.path}: give the form of {sorted(unknown)} in api.app.PATH_PARAMETERS"
            )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = {404: "no such endpoint", 405: "method not allowed"}.get(
            exc.status_code, "the request cannot be served"
        )
        response = error_response(exc.status_code, code, message)
        if exc.status_code == 405 and exc.headers and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unexpected error in a request", extra={"error_type": type(exc).__name__})
        return error_response(500, "internal", "an internal error occurred")

    return _Api(
        direct=served_directly,
        server_error=server_error,
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )


async def serve_api(
    app: Starlette,
    listen: str,
    *,
    shutdown: trio.Event,
    header_timeout: float = 5.0,
    drain_period: float = 5.0,
    reuse_port: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` until ``shutdown`` is set, then drain.

    ``header_timeout`` (``server.header_timeout``, seconds) bounds the time a
    client takes to send a request's headers, from connecting or from the end
    of the previous response: Hypercorn's keep-alive timer runs until a
    request's headers are complete, so headers sent a byte at a time cannot
    hold a connection open. Request bodies are bounded by
    ``server.body_timeout`` in :func:`bothy_notify.api.context.read_json`.

    ``task_status.started`` gets the bound ``host:port`` (port 0 picks a free one).
    Once ``shutdown`` is set the listening socket closes (new connections are
    refused), idle keep-alive connections close, and requests in flight get
    ``drain_period`` seconds (``server.drain_period``) to be answered before
    they are cancelled; this returns when the last one is done.

    ``reuse_port`` binds with ``SO_REUSEPORT`` (one of the node processes of
    ``server.processes`` sharing the port): the socket is bound here and handed
    to Hypercorn as ``fd://``, which listens on it.
    """
    config = HypercornConfig()
    config.bind = [f"fd://{bind_shared(listen).detach()}" if reuse_port else listen]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = drain_period
    # Clients such as load balancers keep connections for long; never force a reconnect.
    config.keep_alive_max_requests = 1_000_000
    config.keep_alive_timeout = header_timeout

    async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
        asgi: Any = app
        await serve(asgi, config, shutdown_trigger=shutdown.wait, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(run)
        task_status.started(binds[0].removeprefix("http://"))
