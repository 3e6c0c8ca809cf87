"""The Matrix relay provider: a registration that pushes through an upstream Matrix push
gateway (an app vendor's Sygnal, or another Bothy node serving the gateway), SPEC
section 14c.

A self-hosted server cannot hold the APNs key of an official app; the app's vendor
runs a push gateway for it. A registration
``{"provider":"matrix","token":PUSHKEY,"gateway":URL,"app_id":APP}`` stores the
pushkey as its token, the gateway's notify URL as its key material (never
returned) and the upstream's app id as its ``app_id``.

Where a notify request may go, at registration
(:meth:`MatrixRelayProvider.check_registration`) and before every attempt: the
URL is https with the path ``/_matrix/push/v1/notify``, its host is in
``push.matrix.allowed_gateways`` (exact or ``*.suffix``; a host no longer allowed
is not contacted: rejected, never invalidating), and every address it resolves
to is public unless ``allow_private_addresses``; the connection goes to the
checked address (:mod:`.lookups`).

One send is one notify request, content-free whatever the message:

=====================  =========================================================
a hint                 ``event_id`` = its ``nid``, ``room_id`` = its thread,
                       ``counts.unread`` = its badge, ``prio`` ``low`` for a
                       ``low`` urgency and ``high`` otherwise
a read clear, a        a badge update: no event, ``counts.unread`` = the badge,
summary                ``prio`` ``low``
a Matrix notification  its event, room, counts and urgency as they came
=====================  =========================================================

and one device: ``{"app_id", "pushkey", "data": {"format": "event_id_only"}}``.

Answers become outcomes here and nowhere else:

==========================================  ========================================
200 (any 2xx) listing the pushkey in        dead (the upstream's provider declared
``rejected``                                it gone, now or earlier)
200 otherwise                               delivered
429                                         transient, Retry-After honoured up to
                                            300 s
5xx                                         transient
no answer: timeout, connection, DNS, TLS    transient, ``ours`` (the gateway is
                                            shared: never a strike)
a redirect (never followed), any other 4xx  rejected (the registration is kept)
==========================================  ========================================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import orjson
import trio

from bothy_notify.config import ConfigError, MatrixRelayConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.http2 import Http2Client
from bothy_notify.push.lookups import Endpoint, SharedLookups, connect_to, parse_endpoint
from bothy_notify.push.port import (
    PLAIN_TOKEN,
    MatrixMessage,
    Message,
    Outcome,
    PushMessage,
    Refusal,
    Registrant,
    Target,
    TopicMessage,
)
from bothy_notify.push.resolver import (
    ResolveError,
    Resolver,
    SystemResolver,
    host_allowed,
    is_blocked_address,
    is_host_pattern,
)
from bothy_notify.push.transport import (
    REQUEST_BOUND,
    LogThrottle,
    NoAnswer,
    ProviderAnswer,
    parse_retry_after,
    retry_delay,
    ssl_context,
)

log = logging.getLogger("bothy.push.matrix")

NOTIFY_PATH = "/_matrix/push/v1/notify"
"""The path of every push gateway's notify endpoint (the spec's; Synapse refuses others)."""
TOKEN_MAX = 512
"""Longest pushkey (the Matrix spec's limit, in bytes of printable ASCII)."""
URL_MAX = 2048
RETRY_MINIMUM = timedelta(seconds=1)
"""Earliest retry after a transient failure."""
HOST_CONNECTIONS = 8
"""Connections per gateway address: Sygnal answers over HTTP/1.1, one request at a time
on each."""
NOT_ALLOWED = "gateway_not_allowed"
PUSHKEY_REJECTED = "pushkey_rejected"
EVENT_ID_ONLY = {"format": "event_id_only"}
"""The device's ``data``: the upstream sends ids only, never content (Element's format)."""


# ---------------------------------------------------------------- registration


def gateway_endpoint(url: object) -> Endpoint | None:
    """A gateway URL as an :class:`~.lookups.Endpoint` when it is an https URL of printable
    ASCII whose path is :data:`NOTIFY_PATH` (no query, no credentials)."""
    if not isinstance(url, str) or len(url) > URL_MAX or not PLAIN_TOKEN.fullmatch(url):
        return None
    endpoint = parse_endpoint(url)
    if endpoint is None or endpoint.path != NOTIFY_PATH:
        return None
    return endpoint


def registrant(body: Mapping[str, Any]) -> Registrant | Refusal:
    """A relay registration: ``token`` (the pushkey, printable ASCII, at most
    :data:`TOKEN_MAX`), ``gateway`` (the upstream's notify URL, stored in its one
    spelling) and ``app_id`` (the upstream's app id). The allowed hosts are the
    provider's check (:meth:`MatrixRelayProvider.check_registration`)."""
    token = body.get("token")
    if not isinstance(token, str) or len(token) > TOKEN_MAX or not PLAIN_TOKEN.fullmatch(token):
        return Refusal("token", f"expected a pushkey of 1 to {TOKEN_MAX} printable characters")
    gateway = body.get("gateway")
    if gateway is None:
        return Refusal("gateway", "required: the upstream push gateway's notify URL")
    endpoint = gateway_endpoint(gateway)
    if endpoint is None:
        return Refusal("gateway", f"expected an https URL ending in {NOTIFY_PATH}")
    if body.get("app_id") is None:
        return Refusal("app_id", "required: the upstream push gateway's app id")
    return Registrant(token, secret=endpoint.url)


# ---------------------------------------------------------------- the request


def notification(message: Message) -> dict[str, Any] | None:
    """The ``notification`` of a notify request for ``message``, without its devices;
    ``None`` for a message a relay does not carry (a topic push)."""
    if isinstance(message, TopicMessage):
        return None
    out: dict[str, Any] = {}
    counts: dict[str, int] = {}
    if isinstance(message, MatrixMessage):
        if message.event_id is not None:
            out["event_id"] = message.event_id
        if message.room_id is not None:
            out["room_id"] = message.room_id
        if message.missed_calls is not None:
            counts["missed_calls"] = message.missed_calls
        low = message.urgency == "low"
    elif isinstance(message, PushMessage):
        out["event_id"] = message.nid
        if message.thread_id is not None:
            out["room_id"] = message.thread_id
        low = message.urgency == "low"
    else:  # a read clear or a summary: a badge update
        low = True
    if message.badge is not None:
        counts["unread"] = message.badge
    if counts:
        out["counts"] = counts
    out["prio"] = "low" if low else "high"
    return out


def request_body(message: Message, target: Target) -> bytes | None:
    """The notify request of ``message`` to ``target``'s pushkey and app id."""
    found = notification(message)
    if found is None or target.app_id is None:
        return None
    found["devices"] = [{"app_id": target.app_id, "pushkey": target.token, "data": EVENT_ID_ONLY}]
    return orjson.dumps({"notification": found})


def matrix_outcome(
    answer: ProviderAnswer | NoAnswer, pushkey: str, retry_after: timedelta | None = None
) -> Outcome:
    """The outcome of one gateway answer, or of no answer; pure (module docstring)."""
    if isinstance(answer, NoAnswer):
        # The gateway is shared by many registrations: no answer says nothing of one.
        return Outcome.transient(answer.reason, RETRY_MINIMUM, ours=True)
    status = answer.status
    if 200 <= status <= 299:
        return (
            Outcome.dead(PUSHKEY_REJECTED)
            if pushkey in _rejected(answer.body)
            else (Outcome.delivered())
        )
    code = f"http_{status}"
    if status == 429 or 500 <= status <= 599:
        return Outcome.transient(code, retry_delay(RETRY_MINIMUM, retry_after))
    if 300 <= status <= 399:
        return Outcome.rejected("redirect")
    return Outcome.rejected(code)


def _rejected(body: bytes) -> Sequence[str]:
    """The ``rejected`` pushkeys of a 200 answer (none when it is not the spec's shape)."""
    try:
        parsed = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return ()
    found = parsed.get("rejected") if isinstance(parsed, dict) else None
    return [k for k in found if isinstance(k, str)] if isinstance(found, list) else ()


# ---------------------------------------------------------------- the provider


def prepare(settings: MatrixRelayConfig, key: str) -> MatrixRelayConfig:
    """Check ``[push.matrix]`` without connecting anywhere; raise :class:`ConfigError`
    naming the key."""
    if not all(is_host_pattern(pattern) for pattern in settings.allowed_gateways):
        raise ConfigError(
            f"{key}.allowed_gateways: each entry is a host or *.suffix"
            " with at least one label before it"
        )
    ssl_context(settings.ca_file, key=f"{key}.ca_file")
    return settings


def build(
    settings: MatrixRelayConfig, clock: Clock, resolver: Resolver | None = None
) -> MatrixRelayProvider:
    return MatrixRelayProvider(
        allowed_gateways=settings.allowed_gateways,
        allow_private_addresses=settings.allow_private_addresses,
        clock=clock,
        resolver=resolver,
        ca_file=settings.ca_file,
    )


class MatrixRelayProvider:
    """Sends notify requests to upstream push gateways; see the module docstring.

    Args:
        allowed_gateways: hosts a gateway URL may name (exact or ``*.suffix``).
        allow_private_addresses: allow non-public gateways (tests).
        clock: the injected clock (Retry-After dates).
        resolver: name resolution (the system's by default).
        ca_file: CA bundle for the gateways (empty: the system's CAs).
        request_bound: seconds a resolution plus request may take.
    """

    name = "matrix"
    bounds_every_send = True
    """Every send ends within its bound (a scope around the resolution, libcurl's timer
    around the request); see ``push/registry.py``."""

    def __init__(
        self,
        *,
        allowed_gateways: Sequence[str],
        clock: Clock,
        allow_private_addresses: bool = False,
        resolver: Resolver | None = None,
        ca_file: str = "",
        request_bound: float = REQUEST_BOUND,
    ) -> None:
        self._allowed = tuple(allowed_gateways)
        self._allow_private = allow_private_addresses
        self._clock = clock
        self._resolver = resolver or SystemResolver()
        self._lookups = SharedLookups(self._resolver)
        self._bound = request_bound
        ssl_context(ca_file, key="push.matrix.ca_file")  # a bad CA file fails here
        self._client = Http2Client(
            ca_file=ca_file, name="matrix", max_host_connections=HOST_CONNECTIONS
        )
        self._throttle = LogThrottle()

    def __repr__(self) -> str:
        return f"MatrixRelayProvider(allowed_gateways={len(self._allowed)})"

    async def check_registration(
        self, token: str, secret: str | None = None
    ) -> tuple[str, str] | None:
        """Refuse a gateway whose host is not allowed or resolves to a private address."""
        endpoint = gateway_endpoint(secret)
        if endpoint is None:
            await trio.lowlevel.checkpoint()
            return ("gateway", f"expected an https URL ending in {NOTIFY_PATH}")
        if not host_allowed(endpoint.host, self._allowed):
            await trio.lowlevel.checkpoint()
            return ("gateway", "the host is not in push.matrix.allowed_gateways")
        try:
            addresses = await self._lookups.resolve(
                endpoint.host, endpoint.port, trio.current_time() + self._bound
            )
        except ResolveError:
            return ("gateway", "the host could not be resolved")
        if addresses is None:
            return ("gateway", "the host could not be resolved in time")
        if not self._allow_private and any(is_blocked_address(a) for a in addresses):
            return ("gateway", "the host resolves to a private or local address")
        return None

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send one notify request; never raises for a gateway or network problem.

        Cancellation abandons the request (the connection stays usable).
        """
        endpoint = gateway_endpoint(target.signing_key)
        if endpoint is None:
            return Outcome.rejected("bad_gateway_url")
        body = request_body(message, target)
        if body is None:
            return Outcome.rejected("not_relayed" if target.app_id is not None else "no_app_id")
        if not host_allowed(endpoint.host, self._allowed):
            if self._throttle.allow(NOT_ALLOWED):
                log.warning(
                    "a Matrix gateway's host is no longer in push.matrix.allowed_gateways: it"
                    " was not contacted and its registration is kept",
                    extra={"key": "push.matrix.allowed_gateways", "reason": NOT_ALLOWED},
                )
            return Outcome.rejected(NOT_ALLOWED)
        deadline = trio.current_time() + self._bound
        try:
            addresses = await self._lookups.resolve(endpoint.host, endpoint.port, deadline)
        except ResolveError:
            return Outcome.transient("dns_error", RETRY_MINIMUM, ours=True)
        if addresses is None:
            return Outcome.transient("timeout", RETRY_MINIMUM, ours=True)
        if not self._allow_private and any(is_blocked_address(a) for a in addresses):
            # Logged with what to check by the token lifecycle (rejections).
            return Outcome.rejected("private_address")
        answer = await self._client.request(
            endpoint.url,
            ["content-type: application/json", "user-agent: bothy-notify"],
            body,
            bound=max(0.001, deadline - trio.current_time()),
            connect_to=connect_to(endpoint.host, endpoint.port, addresses[0]),
        )
        retry_after = None
        if isinstance(answer, ProviderAnswer):
            retry_after = parse_retry_after(answer.header("retry-after"), self._clock.now())
        return matrix_outcome(answer, target.token, retry_after)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._client.aclose()


# ---------------------------------------------------------------- what to check

HINTS: dict[str, str] = {
    "private_address": (
        "the Matrix gateway's host resolves to a private or local address, refused unless"
        " push.matrix.allow_private_addresses"
    ),
    "redirect": "the Matrix gateway answered with a redirect, which is never followed",
    "http_400": "the Matrix gateway refused the notify request as malformed",
    "http_404": (
        f"the Matrix gateway has no notify endpoint there: the URL must end in {NOTIFY_PATH}"
    ),
    "bad_gateway_url": "a stored relay registration's gateway URL is not an https notify URL",
    "no_app_id": "a relay registration has no app_id (the upstream gateway's app id)",
    "not_relayed": "a topic-mode push cannot go through a Matrix gateway",
}
"""What to check, by the reason of a rejection (logged by the token lifecycle)."""
REJECTION_HINT = "the Matrix gateway refused the notify request"
"""Said for a rejection without a hint of its own."""
EXPLAINED = frozenset({NOT_ALLOWED})
"""Rejections this module logs itself (naming the key)."""
