"""Topic mode's HTTP API: recipients and their topic subscriptions (docs/topics.md).

``POST /v1/recipients/register``, ``/unregister`` and ``/subscriptions``, one
per RPC of seed 000 so clients in any language map 1:1. Every binary field is
standard base64. A request is checked in this order; the first failing check
decides the answer, and a request that fails any check changes nothing:

=====  ===================================================  ======  =====================
order  condition                                            status  code / message
=====  ===================================================  ======  =====================
1      no valid device or producer token                    401/403 as every endpoint
2      the body does not decode: not JSON, unknown or       400     invalid_argument /
       mistyped fields, bad base64, an id or secret not             request is malformed
       32 bytes, an unknown channel, a token missing
3      unregister/subscriptions: the recipient is unknown   404     not_found /
                                                                    recipient is not
                                                                    registered
4      the secret's SHA-256 differs from the stored hash    403     permission_denied /
       (compared in constant time)                                  recipient secret is
                                                                    not valid
5      register: the channel has no ``[push.*]`` block,     409     failed_precondition /
       or its block has ``apps`` (a recipient has no               channel is not configured
       ``app_id`` to choose one)
6      register: the webhook URL is not https, its host is  400     invalid_argument /
       not allowed, or it resolves to a blocked address             webhook url is not
                                                                    allowed
7      register: the webhook signing key is not 16..64      400     invalid_argument /
       bytes                                                        webhook signing key
                                                                    length is not allowed
8      subscriptions: a topic of unknown kind or wrong      400     invalid_argument /
       length, more than 3 keys, a key not 42 bytes, a              subscription is
       negative epoch base, a topic twice or in both adds           malformed
       and removes
9      subscriptions: the adds would raise the topic count  429     resource_exhausted /
       above ``limits.max_push_topics``                             recipient topic limit
                                                                    reached
10     the database cannot be reached                       503     unavailable
=====  ===================================================  ======  =====================

No message names an id, secret, token, URL, key or topic. Register and
subscriptions answer ``{"topic_count", "channel", "expires_at"}`` from the
recipient row alone; unregister answers 204.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any, NoReturn, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bothy_notify.api.context import ApiContext, device_claims, producer_claims, read_json
from bothy_notify.api.errors import ApiError
from bothy_notify.push.port import TopicDelivery
from bothy_notify.push.providers import PROVIDERS, topic_channels
from bothy_notify.store import topics as store
from bothy_notify.store.db import StoreUnavailable
from bothy_notify.topics.model import (
    HMAC_KEY_BYTES,
    MAX_HMAC_KEYS,
    RECIPIENT_ID_BYTES,
    RECIPIENT_SECRET_BYTES,
    hmac_pads,
    secret_hash,
    topic_is_valid,
    unb64,
)

T = TypeVar("T")

MALFORMED = "request is malformed"
NOT_REGISTERED = "recipient is not registered"
BAD_SECRET = "recipient secret is not valid"  # noqa: S105 - a constant message
NOT_CONFIGURED = "channel is not configured"
SUBSCRIPTION_MALFORMED = "subscription is malformed"
TOPIC_LIMIT = "recipient topic limit reached"
UNAVAILABLE = "the database is unavailable"

_REGISTER_FIELDS = frozenset(
    {"recipient_id", "recipient_secret", "channel", "token", "environment", "url", "signing_key"}
)
_IDENTITY_FIELDS = frozenset({"recipient_id", "recipient_secret"})
_SUBSCRIPTION_FIELDS = frozenset({"recipient_id", "recipient_secret", "adds", "removes"})
_ADD_FIELDS = frozenset({"topic", "hmac_epoch_base", "hmac_keys", "include_commits"})


def _refuse(status: int, code: str, message: str) -> NoReturn:
    raise ApiError(status, code, message)


def _malformed() -> NoReturn:
    _refuse(400, "invalid_argument", MALFORMED)


def _refusal(refusal: store.Refusal) -> NoReturn:
    if refusal is store.Refusal.NOT_FOUND:
        _refuse(404, "not_found", NOT_REGISTERED)
    if refusal is store.Refusal.WRONG_SECRET:
        _refuse(403, "permission_denied", BAD_SECRET)
    if refusal is store.Refusal.MALFORMED:
        _refuse(400, "invalid_argument", SUBSCRIPTION_MALFORMED)
    _refuse(429, "resource_exhausted", TOPIC_LIMIT)


async def _db(ctx: ApiContext, fn: Callable[[Any], T]) -> T:
    try:
        return await ctx.db.run(fn)
    except StoreUnavailable:
        _refuse(503, "unavailable", UNAVAILABLE)


async def _authenticate(ctx: ApiContext, request: Request) -> None:
    """Check 1: the same token check as every other endpoint, and nothing else.

    A device token (its device row created or updated, a revoked device
    refused) or a producer token (scope ``events:write``): a phone app and a
    backend service alike. No claim is bound to a recipient.
    """
    try:
        await device_claims(ctx, request)
        return
    except StoreUnavailable:
        _refuse(503, "unavailable", UNAVAILABLE)
    except ApiError as exc:
        if exc.status != 401:
            raise
    producer_claims(ctx, request)


async def _body(ctx: ApiContext, request: Request) -> dict[str, Any]:
    try:
        body = await read_json(request, ctx.config.server.max_body_bytes)
    except ApiError as exc:
        if exc.code == "bad_json":
            _malformed()
        raise
    if not isinstance(body, dict):
        _malformed()
    return body


@dataclass(frozen=True, slots=True)
class _Identity:
    recipient_id: bytes
    secret_hash: bytes

    def __repr__(self) -> str:
        return "_Identity(***)"


def _identity(body: dict[str, Any], allowed: frozenset[str]) -> _Identity:
    if set(body) - allowed:
        _malformed()
    recipient_id = unb64(body.get("recipient_id"))
    secret = unb64(body.get("recipient_secret"))
    if recipient_id is None or len(recipient_id) != RECIPIENT_ID_BYTES:
        _malformed()
    if secret is None or len(secret) != RECIPIENT_SECRET_BYTES:
        _malformed()
    return _Identity(recipient_id, secret_hash(secret))


def _state(ctx: ApiContext, state: store.RecipientState) -> JSONResponse:
    expires = state.renewed_at + ctx.config.push.recipient_ttl
    return JSONResponse(
        {
            "topic_count": state.topic_count,
            "channel": state.channel,
            "expires_at": expires.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        }
    )


# ---------------------------------------------------------------- register


def _delivery(body: dict[str, Any]) -> tuple[str, TopicDelivery]:
    """(channel, what the channel read: token or URL, environment, signing key) as far
    as check 2 goes; the channels and how each is given are the provider table's."""
    if any(value is None for value in body.values()):  # a member is a value or absent
        _malformed()
    channel = body.get("channel")
    if not isinstance(channel, str) or channel not in topic_channels():
        _malformed()
    parse = PROVIDERS[channel].topic_delivery
    assert parse is not None
    delivery = parse(body)
    if delivery is None:
        _malformed()
    return channel, delivery


async def post_register(ctx: ApiContext, request: Request) -> JSONResponse:
    """Create a recipient, or replace a known one's delivery config (subscriptions kept)."""
    await _authenticate(ctx, request)
    body = await _body(ctx, request)
    who = _identity(body, _REGISTER_FIELDS)
    channel, delivery = _delivery(body)
    problem = await _db(ctx, lambda c: store.secret_check(c, who.recipient_id, who.secret_hash))
    if problem is store.Refusal.WRONG_SECRET:
        _refusal(problem)
    if channel not in ctx.provider_names or ctx.provider_apps.get(channel):
        # A block with apps has no app for a recipient: topic mode carries no app_id.
        _refuse(409, "failed_precondition", NOT_CONFIGURED)
    refusal = PROVIDERS[channel].topic_refusal
    if refusal is not None:
        registration_check = ctx.registration_check

        async def check(token: str) -> tuple[str, str] | None:
            if registration_check is None:
                return None
            return await registration_check(channel, None, token)

        message = await refusal(delivery, check)
        if message is not None:
            _refuse(400, "invalid_argument", message)
    config = store.DeliveryConfig(
        channel, delivery.token, delivery.environment, delivery.signing_key
    )
    now = ctx.clock.now()
    result = await _db(
        ctx, lambda c: store.register(c, who.recipient_id, who.secret_hash, config, now)
    )
    if isinstance(result, store.Refusal):
        _refusal(result)
    if result.created:
        ctx.metrics.topic_recipients.labels("registered").inc()
    return _state(ctx, result.state)


# ---------------------------------------------------------------- unregister


async def post_unregister(ctx: ApiContext, request: Request) -> Response:
    """Delete the recipient and every subscription of it."""
    await _authenticate(ctx, request)
    body = await _body(ctx, request)
    who = _identity(body, _IDENTITY_FIELDS)
    result = await _db(ctx, lambda c: store.unregister(c, who.recipient_id, who.secret_hash))
    if isinstance(result, store.Refusal):
        _refusal(result)
    ctx.metrics.topic_recipients.labels("unregistered").inc()
    if result:
        ctx.metrics.topic_subscriptions.labels("removed").inc(result)
    return Response(status_code=204)


# ---------------------------------------------------------------- subscriptions


@dataclass(frozen=True, slots=True)
class _Add:
    topic: bytes
    epoch_base: int
    keys: tuple[bytes, ...]
    include_commits: bool


def _decoded_add(item: object) -> _Add:
    """Check 2 for one add: it decodes (its sizes are check 8's business)."""
    if not isinstance(item, dict) or set(item) - _ADD_FIELDS:
        _malformed()
    topic = unb64(item.get("topic"))
    base = item.get("hmac_epoch_base", 0)
    keys = item.get("hmac_keys", [])
    commits = item.get("include_commits", False)
    if topic is None or type(base) is not int or not isinstance(commits, bool):
        _malformed()
    if not isinstance(keys, list):
        _malformed()
    decoded: list[bytes] = []
    for key in keys:
        raw = unb64(key)
        if raw is None:
            _malformed()
        decoded.append(raw)
    return _Add(topic, base, tuple(decoded), commits)


def _subscription_malformed(adds: list[_Add], removes: list[bytes]) -> bool:
    """Check 8: kinds and lengths, key windows, duplicates, a topic both added and removed."""
    add_topics = [a.topic for a in adds]
    if len(set(add_topics)) != len(add_topics) or len(set(removes)) != len(removes):
        return True
    if set(add_topics) & set(removes):
        return True
    for topic in (*add_topics, *removes):
        if not topic_is_valid(topic):
            return True
    for add in adds:
        if len(add.keys) > MAX_HMAC_KEYS or add.epoch_base < 0 or add.epoch_base >= 2**62:
            return True
        if any(len(k) != HMAC_KEY_BYTES for k in add.keys):
            return True
    return False


def _stored(add: _Add) -> store.SubscriptionAdd:
    if not add.keys:
        return store.SubscriptionAdd(add.topic, add.include_commits)
    pads = [hmac_pads(k) for k in add.keys] + [None] * (MAX_HMAC_KEYS - len(add.keys))
    return store.SubscriptionAdd(
        add.topic, add.include_commits, add.epoch_base, (pads[0], pads[1], pads[2])
    )


async def post_subscriptions(ctx: ApiContext, request: Request) -> JSONResponse:
    """Apply subscription adds and removes in one transaction; renews the recipient."""
    await _authenticate(ctx, request)
    body = await _body(ctx, request)
    who = _identity(body, _SUBSCRIPTION_FIELDS)
    raw_adds, raw_removes = body.get("adds", []), body.get("removes", [])
    if not isinstance(raw_adds, list) or not isinstance(raw_removes, list):
        _malformed()
    adds = [_decoded_add(item) for item in raw_adds]
    removes: list[bytes] = []
    for item in raw_removes:
        topic = unb64(item)
        if topic is None:
            _malformed()
        removes.append(topic)
    malformed = _subscription_malformed(adds, removes)
    stored = [] if malformed else [_stored(a) for a in adds]
    now = ctx.clock.now()
    limit = ctx.config.limits.max_push_topics
    result = await _db(
        ctx,
        lambda c: store.update_subscriptions(
            c,
            who.recipient_id,
            who.secret_hash,
            adds=stored,
            removes=removes,
            malformed=malformed,
            max_topics=limit,
            now=now,
        ),
    )
    if isinstance(result, store.Refusal):
        _refusal(result)
    if result.added:
        ctx.metrics.topic_subscriptions.labels("added").inc(result.added)
    if result.removed:
        ctx.metrics.topic_subscriptions.labels("removed").inc(result.removed)
    return _state(ctx, result.state)
