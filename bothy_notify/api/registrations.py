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

import base64
import binascii
import re
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext, device_claims, read_json
from bothy_notify.api.errors import ApiError, invalid
from bothy_notify.kernel.ids import is_valid_id
from bothy_notify.store import registrations as regs

ENVIRONMENTS = ("sandbox", "production")
TOKEN_MAX = {"apns": 200, "fcm": 4096, "webhook": 2048, "fake": 4096}
"""Longest token per provider: APNs device tokens are hex of 64 bytes today (200
leaves room), FCM registration tokens are a few hundred characters (4096 as
Firebase allows), webhook URLs 2048 (what browsers and proxies reliably carry)."""
_TOKEN_MAX_OTHER = 4096
_APNS_TOKEN = re.compile(r"^[0-9a-fA-F]{64,200}$")
_PLAIN_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
LIMIT_REACHED = (
    "this person holds the most push registrations allowed"
    " (push.max_registrations_per_person); delete one first"
)
_FIELDS = {"provider", "token", "environment", "app_id", "signing_key"}


async def post_registration(ctx: ApiContext, request: Request) -> JSONResponse:
    claims = await device_claims(ctx, request)
    body = await read_json(request, ctx.config.server.max_body_bytes)
    fields = await _validate(ctx, body)
    now = ctx.clock.now()
    try:
        result = await ctx.db.run(
            lambda c: regs.upsert(
                c,
                user_id=claims.user_id,
                device_id=claims.device_id,
                provider=fields["provider"],
                token=fields["token"],
                environment=fields.get("environment"),
                app_id=fields.get("app_id"),
                signing_key=fields.get("signing_key"),
                now=now,
                max_per_person=ctx.config.push.max_registrations_per_person,
            )
        )
    except regs.RegistrationLimitReached:
        raise ApiError(409, "too_many_registrations", LIMIT_REACHED) from None
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


async def _validate(ctx: ApiContext, body: Any) -> dict[str, Any]:
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
    token = body.get("token")
    if token is None:
        raise invalid("token", "required")
    if not isinstance(token, str) or not token:
        raise invalid("token", "expected a non-empty string")
    limit = TOKEN_MAX.get(provider, _TOKEN_MAX_OTHER)
    if len(token) > limit:
        raise invalid("token", f"longer than {limit} characters, the limit for {provider}")
    environment = body.get("environment")
    if environment is not None and environment not in ENVIRONMENTS:
        raise invalid("environment", "expected sandbox or production")
    app_id = body.get("app_id")
    if app_id is not None and not is_valid_id(app_id):
        raise invalid("app_id", "does not have the required form")
    signing_key = body.get("signing_key")
    if provider == "apns":
        if not _APNS_TOKEN.fullmatch(token):
            raise invalid("token", "expected an APNs device token (hex)")
        environment = environment or "production"
    elif provider == "webhook":
        if not webhook_url(token):
            raise invalid("token", "expected an https URL without credentials or fragment")
        if signing_key is None:
            raise invalid("signing_key", "required for a webhook")
        if not isinstance(signing_key, str) or not 16 <= len(_b64(signing_key)) <= 64:
            raise invalid("signing_key", "expected base64 of 16 to 64 bytes")
    elif not _PLAIN_TOKEN.fullmatch(token):
        raise invalid("token", "does not have the required form")
    if provider != "webhook" and signing_key is not None:
        raise invalid("signing_key", "only webhooks take a signing key")
    if ctx.registration_check is not None:
        problem = await ctx.registration_check(provider, token)
        if problem is not None:
            raise invalid(*problem)
    out = {"provider": provider, "token": token, "environment": environment, "app_id": app_id}
    if signing_key is not None:
        out["signing_key"] = signing_key
    return out


def webhook_url(token: str) -> bool:
    """A webhook token is an ``https://host[:port]/path?query`` URL of printable ASCII,
    without user info or fragment (allowed domains and addresses are checked by the
    provider's registration check)."""
    if not _PLAIN_TOKEN.fullmatch(token):
        return False
    parts = urlsplit(token)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        return False
    return (
        parts.scheme == "https"
        and bool(parts.hostname)
        and port_ok
        and parts.username is None
        and parts.password is None
        and not parts.fragment
    )


def _b64(text: str) -> bytes:
    value = text.removeprefix("whsec_")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b""
