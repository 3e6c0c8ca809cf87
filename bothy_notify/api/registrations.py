"""Push registrations of the calling device (SPEC section 9).

``POST /v1/registrations`` stores, refreshes, restores or takes over a
registration (see :mod:`bothy_notify.store.registrations`): a device token
another person registered moves to the caller, a webhook URL never moves
between people (each person gets a registration of their own), and a person
holds at most ``push.max_registrations_per_person`` (409 beyond). Tokens are
capped per provider (:data:`TOKEN_MAX`, 422 naming the field). Counts
``bothy_registrations_total{action}``: ``registered``, ``restored``, and
``deleted`` (``DELETE``, and invalidated registrations deleted to make room).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import ApiError, invalid
from bothy_notify.kernel.ids import is_valid_id
from bothy_notify.push.port import Refusal, Registrant
from bothy_notify.push.providers import PROVIDERS, REGISTRATION_FIELDS, entry
from bothy_notify.store import registrations as regs

ENVIRONMENTS = ("sandbox", "production")
TOKEN_MAX = {name: e.token_max for name, e in PROVIDERS.items()}
"""Longest token per provider (the provider table's): APNs device tokens are hex of 64
bytes today (200 leaves room), FCM registration tokens are a few hundred characters
(4096 as Firebase allows), webhook URLs and Web Push endpoints 2048 (what browsers
and proxies reliably carry)."""
LIMIT_REACHED = (
    "this person holds the most push registrations allowed"
    " (push.max_registrations_per_person); delete one first"
)
TAKEN = (
    "this push subscription is registered by another person; it never moves between"
    " people: unsubscribe in the browser and subscribe again for a new endpoint"
)
UNKNOWN_APP = "app_id: not one of this provider's configured apps"
_FIELDS = {"provider", "app_id", "environment", *REGISTRATION_FIELDS}


async def post_registration(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    provider, app_id, found = await _validate(ctx, body)
    spec = entry(provider)
    now = ctx.clock.now()
    if found.expires_at is not None and found.expires_at <= now:
        raise invalid("subscription.expirationTime", "already past")
    try:
        result = await ctx.db.run(
            lambda c: regs.upsert(
                c,
                user_id=claims.user_id,
                device_id=claims.device_id,
                provider=provider,
                token=found.token,
                environment=found.environment,
                app_id=app_id,
                signing_key=found.secret,
                expires_at=found.expires_at,
                moves=spec.moves,
                now=now,
                max_per_person=ctx.config.push.max_registrations_per_person,
            )
        )
    except regs.RegistrationLimitReached:
        raise ApiError(409, "too_many_registrations", LIMIT_REACHED) from None
    except regs.RegistrationTaken:
        raise ApiError(409, "registration_taken", TAKEN) from None
    metrics = ctx.metrics
    metrics.registration("deleted", result.evicted)
    if result.change in (regs.Change.CREATED, regs.Change.MOVED):
        metrics.registration("registered")
    elif result.change is regs.Change.RESTORED:
        metrics.registration("restored")
    return JSONResponse(result.registration.public(), 201 if result.created else 200)


async def list_registrations(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    found = await ctx.db.run(lambda c: regs.list_for(c, claims.user_id))
    return JSONResponse({"registrations": [r.public() for r in found]})


async def delete_registration(ctx: ApiContext, request: Request) -> Response:
    claims = await device_claims(ctx, request)
    # Of the daemon's form: the binding (api.app) answered any other with 204.
    registration_id = request.path_params["registration_id"]
    if await ctx.db.run(lambda c: regs.delete(c, claims.user_id, registration_id)):
        ctx.metrics.registration("deleted")
    return Response(status_code=204)


NOT_CONFIGURED = "Web Push is not configured on this server ([push.webpush])"


async def get_webpush_key(ctx: ApiContext, request: Request) -> JSONResponse:
    """``GET /v1/webpush/key[?app_id=]``: the VAPID public key a page subscribes with
    (``applicationServerKey``), base64url. No token: the key is public. With
    ``[push.webpush.apps]`` the ``app_id`` names the app (422 ``unknown_app``)."""
    if not ctx.vapid_keys:
        raise ApiError(404, "not_configured", NOT_CONFIGURED)
    key = ctx.vapid_keys.get("")
    if key is None:
        key = ctx.vapid_keys.get(request.query_params.get("app_id") or "")
        if key is None:
            raise ApiError(422, "unknown_app", UNKNOWN_APP)
    return JSONResponse({"public_key": key}, headers={"cache-control": "public, max-age=300"})


async def _validate(ctx: ApiContext, body: Any) -> tuple[str, str | None, Registrant]:
    """The provider, the app and what its provider read from the body (every check of
    SPEC section 9, each 422 naming its field)."""
    if not isinstance(body, dict):
        raise invalid("(body)", "expected an object")
    for name in sorted(set(body) - _FIELDS):
        raise invalid(name if re.fullmatch(r"[a-z_]{1,40}", name) else "(body)", "unknown field")
    for name in sorted(_FIELDS & set(body)):
        if body[name] is None:  # a member is a value or absent, never null
            raise invalid(name, "must not be null")
    provider = body.get("provider")
    if provider is None:
        raise invalid("provider", "required")
    if not isinstance(provider, str) or provider not in ctx.provider_names:
        raise invalid("provider", "not a configured provider")
    spec = entry(provider)
    for name in sorted(set(body) & REGISTRATION_FIELDS - spec.fields):
        takers = sorted(n for n, e in PROVIDERS.items() if name in e.fields)
        raise invalid(name, f"only {', '.join(takers)} registrations take it")
    if "token" in spec.fields:
        token = body.get("token")
        if token is None:
            raise invalid("token", "required")
        if not isinstance(token, str) or not token:
            raise invalid("token", "expected a non-empty string")
        if len(token) > spec.token_max:
            raise invalid(
                "token", f"longer than {spec.token_max} characters, the limit for {provider}"
            )
    environment = body.get("environment")
    if environment is not None and environment not in ENVIRONMENTS:
        raise invalid("environment", "expected sandbox or production")
    app_id = body.get("app_id")
    if app_id is not None and not is_valid_id(app_id):
        raise invalid("app_id", "does not have the required form")
    found = spec.registrant(body)
    if isinstance(found, Refusal):
        raise invalid(found.field, found.problem)
    apps = ctx.provider_apps.get(provider, ())
    if apps and app_id not in apps:
        raise ApiError(422, "unknown_app", UNKNOWN_APP)
    if ctx.registration_check is not None:
        problem = await ctx.registration_check(provider, app_id, found.token, found.secret)
        if problem is not None:
            raise invalid(*problem)
    return provider, app_id, found
