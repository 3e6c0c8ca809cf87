"""What the HTTP handlers share: store, verifier, configuration, clock, metrics."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import trio
from starlette.requests import Request

from bothy_notify.api.errors import ApiError, bad_json, body_timeout, too_large
from bothy_notify.api.status import StatusSource
from bothy_notify.auth import AuthError, DeviceClaims, ProducerClaims, TokenVerifier
from bothy_notify.config import Config, LiveConfig
from bothy_notify.kernel import strict_json
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.matrix.gateway import MatrixGateway
from bothy_notify.notify.catalogue import CatalogueSource, FixedCatalogue
from bothy_notify.store import people
from bothy_notify.store.appender import GroupAppender, LocalRound
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.events import EventValidator


@dataclass
class ApiContext:
    """Collaborators of the HTTP API.

    ``readiness`` answers which parts of this node are running (``/readyz``);
    ``cluster`` what this node sees of its cluster (``None`` on a single node).
    ``provider_names`` are the configured providers and ``provider_apps`` their
    configured app ids (a provider absent or with none has one default app):
    the registration API and the OpenAPI document's enumerations read them.
    ``registration_check`` validates a registration's token for its provider and
    app, ``(provider, app_id, token)`` (returns the bad field and problem, or
    ``None``). ``catalogue`` is the
    source of the kind catalogue served by ``GET /v1/catalogue`` (refreshed
    per request). ``status`` serves the operator's status page (``None``: 404).
    ``live_config`` is the node's live configuration; handlers read
    :attr:`config` at each use, so a reload reaches the next request.
    """

    db: Database
    verifier: TokenVerifier
    live_config: LiveConfig
    clock: Clock
    metrics: Metrics
    validator: EventValidator
    provider_names: frozenset[str]
    provider_apps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    vapid_keys: Mapping[str, str] = field(default_factory=dict)
    """Web Push's VAPID public keys (base64url) by app id (``""``: the one default app)."""
    readiness: Callable[[], Mapping[str, bool]] = field(default=lambda: {})
    cluster: Callable[[], Mapping[str, Any] | None] = field(default=lambda: None)
    registration_check: Callable[..., Awaitable[tuple[str, str] | None]] | None = None
    catalogue: CatalogueSource = field(default_factory=FixedCatalogue)
    extras: dict[str, Any] = field(default_factory=dict)
    status: StatusSource | None = None
    matrix: MatrixGateway | None = None
    """The Matrix push gateway (``None``: ``[matrix_gateway]`` is not configured)."""
    local_round: LocalRound | None = None
    """The consumer round when this node runs one: while it holds the round, appends
    wake it directly instead of by ``NOTIFY`` (``store.appender``)."""

    def __repr__(self) -> str:
        return "ApiContext()"

    @property
    def config(self) -> Config:
        """The configuration in use now (a reload swaps it between two reads)."""
        return self.live_config.current

    @cached_property
    def appender(self) -> GroupAppender:
        """Appends of ``POST /v1/events`` without an ``Idempotency-Key``, grouped."""
        return GroupAppender(self.db, local_round=self.local_round)


def bearer(request: Request) -> str:
    """The token of the one ``Authorization: Bearer`` header; 401 otherwise.

    Two ``Authorization`` headers are refused: a proxy in front may have read
    the other one. The token's own shape is the verifier's business.
    """
    headers = request.headers.getlist("authorization")
    scheme, _, token = (headers[0] if len(headers) == 1 else "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "a bearer token is required")
    return token.strip()


async def device_claims(ctx: ApiContext, request: Request) -> DeviceClaims:
    """Verify the device token and create or update its device row.

    Refuses (403) a revoked device, and a person the app deactivated
    (``user.upserted`` with ``active: false``); neither changes any row.
    """
    try:
        claims = ctx.verifier.device(bearer(request))
    except AuthError as exc:
        raise ApiError(401, "unauthorized", "the token is missing, invalid or expired") from exc
    state = await ctx.db.run(partial(_admit_device, claims=claims))
    if state == "revoked":
        raise ApiError(403, "device_revoked", "this device has been revoked")
    if state == people.DEACTIVATED:
        raise ApiError(403, "deactivated", "this person has been deactivated")
    return claims


def _admit_device(conn: Conn, *, claims: DeviceClaims) -> str:
    return people.admit_device(
        conn,
        user_id=claims.user_id,
        device_id=claims.device_id,
        platform=claims.platform,
        principal_kind=claims.kind,
    )


def producer_claims(ctx: ApiContext, request: Request) -> ProducerClaims:
    try:
        return ctx.verifier.producer(bearer(request))
    except AuthError as exc:
        status = 403 if exc.code == "forbidden" else 401
        message = (
            "the token lacks scope events:write"
            if status == 403
            else "the token is missing, invalid or expired"
        )
        raise ApiError(status, exc.code, message) from exc


BODY_DEADLINE = "bothy.body_deadline"
"""Key of the request's scope holding the Trio time by which its body must have
arrived (``server.body_timeout`` after the handler started; see ``api.app``)."""


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON; 413 above ``limit`` bytes, 400 when malformed,
    408 when the body has not arrived by the request's deadline.

    Malformed includes what Python's parser would otherwise let through or
    choke on (:mod:`bothy_notify.kernel.strict_json`): ``NaN``/``Infinity``,
    numbers too large for a double, a member named twice, and nesting too deep
    to parse. The deadline (``server.body_timeout`` from
    the end of the headers) bounds the whole body, not each read, so a client
    sending one byte at a time cannot hold the request open.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large()
    body = bytearray()
    with trio.move_on_at(request.scope.get(BODY_DEADLINE, math.inf)) as deadline:
        # Closed explicitly: stopping early must not leave the generator to the collector.
        async with aclosing(request.stream()) as stream:
            async for chunk in stream:
                body.extend(chunk)
                if len(body) > limit:
                    raise too_large()
    if deadline.cancelled_caught:
        raise body_timeout()
    try:
        return strict_json.loads(body)
    except ValueError:
        raise bad_json() from None
