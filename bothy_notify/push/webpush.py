"""The Web Push provider: browsers and installed web apps (RFC 8030), the body
encrypted per RFC 8291 (``aes128gcm``, RFC 8188), our server identified per RFC
8292 (VAPID).

A registration carries a browser's ``PushSubscription.toJSON()`` as
``subscription``: its ``endpoint`` is the registration's token (unique, and it
never moves between people), its ``keys`` (``p256dh``, the browser's P-256
public key, and ``auth``, a 16-byte secret) are stored as the registration's
key material (never returned) and its ``expirationTime`` as the registration's
expiry. An endpoint must be https, its port (if any) 1-65535, and its host in
``push.webpush.allowed_endpoints`` (exact or ``*.suffix``); it is stored in one
spelling (:class:`Endpoint`: the host lower-cased without a trailing dot, no
``:443``), the VAPID ``aud`` is its origin.

One send (:meth:`WebPushProvider.send`):

1. a subscription past its ``expirationTime`` is dead without a send;
2. an endpoint that answered 429 is not contacted before its Retry-After
   (:class:`EndpointBackoff`: per endpoint, never per host);
3. the host must still be allowed (else rejected, logged, never contacted);
   it is resolved for this attempt (attempts to one push service at the same
   moment share one lookup, answered after each began), and every address is
   judged by the registries' table (:mod:`.addresses`) unless
   ``allow_private_addresses``; the connection goes to the checked address
   (libcurl's ``CONNECT_TO``: TLS and ``Host`` name the endpoint's host, a DNS
   answer changed in between cannot redirect it; a connection is reused only
   for the same host and address; :mod:`.lookups`);
4. the content-free payload (the same JSON every provider sends) is encrypted
   for the subscription: an ephemeral P-256 key pair per message, ECDH with
   ``p256dh`` and HKDF with ``auth`` (``cryptography``), then the ``aes128gcm``
   content coding by ``http-ece`` (AES-128-GCM, one record); a body over
   :data:`BODY_MAX` (4,096 bytes) is rejected without a send;
5. ``POST`` to the endpoint with ``TTL`` (``push.max_age``), ``Urgency`` (the
   message's, else ``normal``), ``Topic`` (the thread's grouping value,
   :mod:`.grouping`: an HMAC of the thread id under the server key, 32 base64url
   characters: pushes of a thread collapse at the push service, which never learns
   or can guess the id; a topic push's a digest of its topic),
   ``Content-Encoding: aes128gcm`` and ``Authorization: vapid t=<JWT>, k=<public
   key>``; the ES256 JWT has ``aud`` = the endpoint's origin, ``sub`` =
   ``push.webpush.subject`` and ``exp`` 12 hours ahead, and is cached per origin
   until an hour before that.

Answers become outcomes here and nowhere else:

============================================  ===================================
200, 201, 202                                 delivered
404, 410                                      dead (the subscription is gone)
413                                           rejected (the payload is too large)
400, 401, 403                                 rejected, never invalidating: the
                                              push service refused our VAPID JWT
                                              or subject; logged once a minute
                                              with the keys to check
429                                           transient, Retry-After honoured up
                                              to 300 s; that endpoint (never the
                                              others of its host) is not contacted
                                              again before it
5xx                                           transient
no answer: timeout, connection, DNS, TLS      transient, ``ours`` (the push service
                                              is shared: never a strike)
every other status (a redirect included)      rejected
============================================  ===================================
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import http_ece
import httpx
import jwt
import orjson
import trio
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bothy_notify.config import ConfigError, Secret, WebPushSettings
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.http2 import Http2Client
from bothy_notify.push.lookups import SharedLookups, connect_to, parse_endpoint
from bothy_notify.push.port import (
    Message,
    Outcome,
    Refusal,
    Registrant,
    Target,
    TopicMessage,
    Unresolved,
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
    parse_retry_after,
    retry_delay,
    ssl_context,
)

log = logging.getLogger("bothy.push.webpush")

TOKEN_MAX = 2048
"""Longest endpoint (the push services' are a few hundred characters)."""
RETRY_MINIMUM = timedelta(seconds=1)
"""Earliest retry after a transient Web Push failure."""
JWT_LIFETIME = timedelta(hours=12)
"""A VAPID JWT's ``exp`` from its minting (RFC 8292 allows at most 24 hours)."""
JWT_RENEW_BEFORE = timedelta(hours=1)
"""A cached JWT is replaced this long before its ``exp``."""
TOPIC_MAX = 32
"""RFC 8030's ``Topic`` is at most 32 base64url characters."""
HOST_CONNECTIONS = 8
"""Connections per push service address: HTTP/2 multiplexes on one, a service that
answers over HTTP/1.1 gets a few in parallel."""
URGENCIES = ("very-low", "low", "normal", "high")
DELIVERED = frozenset({200, 201, 202})
GONE = frozenset({404, 410})
OUR_MISTAKE = frozenset({400, 401, 403})
"""The push service refused our request as such: the VAPID key or subject."""
NOT_ALLOWED = "endpoint_not_allowed"
EXPIRED = "subscription_expired"
RATE_LIMITED = "http_429"
"""The reason of a send to an endpoint that answered 429 and is backed off (the 429's)."""
BODY_MAX = 4096
"""Longest encrypted body: RFC 8291 pushes fit one 4,096-byte record, and UnifiedPush
distributors refuse larger ones (SERV 1.2)."""
BACKOFF_ENTRIES = 10_000
"""Endpoints remembered as backed off at once (each a 32-byte digest and a time); past
it, the soonest to end are forgotten first."""
_SUBSCRIPTION_FIELDS = frozenset({"endpoint", "keys", "expirationTime"})
_KEY_FIELDS = frozenset({"p256dh", "auth"})
_POINT_BYTES = 65
_AUTH_BYTES = 16


# ---------------------------------------------------------------- base64url and keys


def b64url(data: bytes) -> str:
    """base64url without padding (what browsers and RFC 8292 use)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: object) -> bytes | None:
    """base64url with or without padding; ``None`` when it is not."""
    if not isinstance(text, str) or len(text) > 1024 or not _BASE64URL.fullmatch(text):
        return None
    bare = text.rstrip("=")
    try:
        return base64.urlsafe_b64decode(bare + "=" * (-len(bare) % 4))
    except (binascii.Error, ValueError):
        return None


_BASE64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def public_key_b64(key: ec.EllipticCurvePrivateKey) -> str:
    """The public key as the page's ``applicationServerKey``: base64url of the
    uncompressed point."""
    raw = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return b64url(raw)


def generate_vapid_key() -> tuple[str, str]:
    """A new VAPID key pair: (the private key's PKCS#8 PEM, the public key in base64url)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")
    return pem, public_key_b64(key)


def load_vapid_key(secret: Secret | None, key: str) -> ec.EllipticCurvePrivateKey:
    """The VAPID private key of ``key`` (``push.webpush.vapid_private_key`` or an app's):
    a PEM (what ``vapid generate`` stores), or the base64url of the raw 32-byte
    scalar (what other Web Push tools print).

    Raises :class:`ConfigError` naming the key (never its value), or
    :class:`~.port.Unresolved` for a ``secret:`` not resolved yet.
    """
    if secret is None:
        raise ConfigError(f"{key}: required key is missing")
    if not secret.is_resolved:
        raise Unresolved(key)
    text = secret.reveal().strip()
    problem = f"{key}: not a P-256 private key (expected the PEM that vapid generate stores)"
    loaded: object
    if "-----BEGIN" in text:
        try:
            loaded = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise ConfigError(problem) from None
    else:
        raw = unb64url(text)
        if raw is None or len(raw) != 32:
            raise ConfigError(problem)
        try:
            loaded = ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
        except ValueError:
            raise ConfigError(problem) from None
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(
        loaded.curve, ec.SECP256R1
    ):
        raise ConfigError(problem)
    return loaded


def p256_point(raw: bytes) -> ec.EllipticCurvePublicKey | None:
    """``raw`` as a P-256 public key when it is an uncompressed point on the curve."""
    if len(raw) != _POINT_BYTES or raw[0] != 0x04:
        return None
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except ValueError:
        return None


def pack_keys(p256dh: bytes, auth: bytes) -> str:
    """The stored key material of a subscription: ``<p256dh>.<auth>`` in base64url."""
    return f"{b64url(p256dh)}.{b64url(auth)}"


def unpack_keys(text: str | None) -> tuple[bytes, bytes] | None:
    """The (p256dh, auth) of stored key material, or ``None`` when it is not that shape
    (the point was checked to be on the curve at registration; a stored one that is
    not fails the encryption, which :meth:`WebPushProvider.send` says)."""
    if not text or text.count(".") != 1:
        return None
    first, second = text.split(".")
    p256dh, auth = unb64url(first), unb64url(second)
    if p256dh is None or auth is None or len(auth) != _AUTH_BYTES:
        return None
    if len(p256dh) != _POINT_BYTES or p256dh[0] != 0x04:
        return None
    return p256dh, auth


# ---------------------------------------------------------------- registration


def registrant(body: Mapping[str, Any]) -> Registrant | Refusal:
    """A registration's ``subscription`` (``PushSubscription.toJSON()``): the endpoint
    (https, at most :data:`TOKEN_MAX`), ``keys.p256dh`` (an uncompressed P-256 point
    on the curve, base64url), ``keys.auth`` (16 bytes, base64url) and an optional
    ``expirationTime`` (milliseconds since the epoch, or null). The allowed hosts are
    the provider's check (:meth:`WebPushProvider.check_registration`)."""
    subscription = body.get("subscription")
    if subscription is None:
        return Refusal("subscription", "required (the browser's PushSubscription.toJSON())")
    if not isinstance(subscription, dict):
        return Refusal("subscription", "expected an object (the browser's PushSubscription)")
    if set(subscription) - _SUBSCRIPTION_FIELDS:
        return Refusal("subscription", "unknown field (expected endpoint, keys, expirationTime)")
    endpoint = subscription.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        return Refusal("subscription.endpoint", "required: an https URL")
    if len(endpoint) > TOKEN_MAX:
        return Refusal("subscription.endpoint", f"longer than {TOKEN_MAX} characters")
    parsed = parse_endpoint(endpoint)
    if _endpoint_url(endpoint) is None or parsed is None:
        return Refusal(
            "subscription.endpoint",
            "expected an https URL without credentials, its port 1-65535 if any",
        )
    keys = subscription.get("keys")
    if not isinstance(keys, dict):
        return Refusal("subscription.keys", "required: an object with p256dh and auth")
    if set(keys) - _KEY_FIELDS:
        return Refusal("subscription.keys", "unknown field (expected p256dh and auth)")
    p256dh = unb64url(keys.get("p256dh"))
    if p256dh is None or p256_point(p256dh) is None:
        return Refusal(
            "subscription.keys.p256dh",
            "expected the base64url of an uncompressed P-256 point on the curve",
        )
    auth = unb64url(keys.get("auth"))
    if auth is None or len(auth) != _AUTH_BYTES:
        return Refusal("subscription.keys.auth", "expected the base64url of 16 bytes")
    expires = subscription.get("expirationTime")
    expires_at: datetime | None = None
    if expires is not None:
        if (
            isinstance(expires, bool)
            or not isinstance(expires, int | float)
            or not math.isfinite(expires)
            or not 0 < expires < 253_402_300_800_000  # before year 10000
        ):
            return Refusal(
                "subscription.expirationTime", "expected null or milliseconds since the epoch"
            )
        expires_at = datetime.fromtimestamp(expires / 1000, UTC)
    # Stored in its one spelling: the same subscription in another case is the same token.
    return Registrant(parsed.url, secret=pack_keys(p256dh, auth), expires_at=expires_at)


def pushkey_registrant(
    pushkey: str, data: Mapping[str, Any] | None, _environment: str | None
) -> Registrant | Refusal:
    """A Matrix pusher of a Web Push app: the pushkey is the subscription's endpoint
    and ``data.keys`` its ``p256dh`` and ``auth`` (SPEC section 14c); or, as Sygnal
    reads a pusher, the pushkey is ``p256dh`` and ``data.endpoint`` and
    ``data.auth`` the rest. Checked as a registration's ``subscription`` is."""
    data = data or {}
    endpoint = data.get("endpoint")
    if isinstance(endpoint, str):
        keys: object = {"p256dh": pushkey, "auth": data.get("auth")}
    else:
        endpoint, keys = pushkey, data.get("keys")
    return registrant({"subscription": {"endpoint": endpoint, "keys": keys}})


def _endpoint_url(endpoint: str) -> httpx.URL | None:
    try:
        url = httpx.URL(endpoint)
    except httpx.InvalidURL:
        return None
    # An empty fragment ("...#") is a fragment too: a push endpoint never has one.
    if url.scheme != "https" or not url.host or url.userinfo or "#" in endpoint:
        return None
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in endpoint):
        return None
    return url


# ---------------------------------------------------------------- VAPID


class VapidTokens:
    """The VAPID ``Authorization`` value per origin: an ES256 JWT (``aud`` the origin,
    ``exp`` :data:`JWT_LIFETIME` ahead, ``sub`` the subject) and the public key,
    minted on first use and again :data:`JWT_RENEW_BEFORE` before its ``exp``."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, subject: str, clock: Clock) -> None:
        self._key = key
        self._subject = subject
        self._clock = clock
        self.public_key = public_key_b64(key)
        self._cached: dict[str, tuple[str, datetime]] = {}
        self.minted = 0

    def authorization(self, origin: str) -> str:
        now = self._clock.now()
        cached = self._cached.get(origin)
        if cached is not None and now < cached[1] - JWT_RENEW_BEFORE:
            return cached[0]
        expires = now + JWT_LIFETIME
        token = jwt.encode(
            {"aud": origin, "exp": int(expires.timestamp()), "sub": self._subject},
            self._key,
            algorithm="ES256",
            headers={"typ": "JWT"},
        )
        value = f"vapid t={token}, k={self.public_key}"
        if len(self._cached) > 1024:  # push services are a handful of origins
            self._cached.clear()
        self._cached[origin] = (value, expires)
        self.minted += 1
        return value

    def __repr__(self) -> str:
        return f"VapidTokens(minted={self.minted})"


# ---------------------------------------------------------------- the message


_UNCOMPRESSED = (serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
_WEBPUSH_INFO = b"WebPush: info\x00"
_RECORD_SIZE = 4096


def _hkdf(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF-SHA256 for one output block (length <= 32)."""
    prk = hmac.digest(salt, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")[:length]


@functools.lru_cache(maxsize=4096)
def _peer(p256dh: bytes) -> ec.EllipticCurvePublicKey:
    """A subscription's public key (parsing checks the point; a few thousand kept)."""
    return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), p256dh)


def encrypt(content: bytes, p256dh: bytes, auth: bytes) -> bytes:
    """``content`` encrypted for one subscription (RFC 8291).

    The Web Push key agreement here (RFC 8291 section 3.3): a fresh ephemeral P-256
    key pair per message, ECDH with the browser's ``p256dh``, and the input keying
    material ``HKDF(auth, ecdh_secret, "WebPush: info" || ua_public || as_public)``;
    then ``http-ece`` makes the ``aes128gcm`` content coding of RFC 8188 from it (a
    random salt, HKDF to the content key and nonce, AES-128-GCM in one record). The
    header's key id is the ephemeral public key, which ``http-ece`` takes only as
    text in this mode, so it is set in the header it returns.
    """
    ephemeral = ec.generate_private_key(ec.SECP256R1())
    as_public = ephemeral.public_key().public_bytes(*_UNCOMPRESSED)
    secret = ephemeral.exchange(ec.ECDH(), _peer(p256dh))
    ikm = _hkdf(auth, secret, _WEBPUSH_INFO + p256dh + as_public, 32)
    coded: bytes = http_ece.encrypt(
        content, salt=os.urandom(16), key=ikm, keyid="", rs=_RECORD_SIZE, version="aes128gcm"
    )
    # salt (16) || record size (4) || key id length (1, here 0) || records
    return coded[:20] + bytes((len(as_public),)) + as_public + coded[21:]


def topic_header(topic: bytes) -> str:
    """A topic push's ``Topic``: a base64url SHA-256 digest of the topic cut to 32
    characters (a push about a thread carries its grouping value instead)."""
    return b64url(hashlib.sha256(topic).digest())[:TOPIC_MAX]


def urgency_of(message: Message) -> str:
    """The message's urgency where the payload carries one (the kind's), else normal."""
    urgency = getattr(message, "urgency", None)
    return urgency if isinstance(urgency, str) and urgency in URGENCIES else "normal"


def webpush_outcome(status: int | NoAnswer, retry_after: timedelta | None = None) -> Outcome:
    """The outcome of one push service answer, or of no answer; pure (module docstring)."""
    if isinstance(status, NoAnswer):
        # The push service is shared by many subscriptions: no answer says nothing
        # about this one.
        return Outcome.transient(status.reason, RETRY_MINIMUM, ours=True)
    if status in DELIVERED:
        return Outcome.delivered()
    code = f"http_{status}"
    if status in GONE:
        return Outcome.dead(code)
    if status == 429 or 500 <= status <= 599:
        return Outcome.transient(code, retry_delay(RETRY_MINIMUM, retry_after))
    if 300 <= status <= 399:
        return Outcome.rejected("redirect")
    return Outcome.rejected(code)


class EndpointBackoff:
    """Endpoints that answered 429, each until its Retry-After (at least the provider's
    minimum): keyed by the endpoint, never by its host, since a push service limits
    each subscription on its own (UnifiedPush asks application servers to honour
    limits per endpoint, not host) and another subscription on the same host must
    not wait. At most :data:`BACKOFF_ENTRIES` are kept, by the endpoint's digest."""

    def __init__(self, limit: int = BACKOFF_ENTRIES) -> None:
        self._until: dict[bytes, datetime] = {}
        self._limit = limit

    def __repr__(self) -> str:
        return f"EndpointBackoff(endpoints={len(self._until)})"

    def left(self, endpoint: str, now: datetime) -> timedelta | None:
        """How long ``endpoint`` is still backed off at ``now`` (``None``: not)."""
        if not self._until:
            return None
        key = hashlib.sha256(endpoint.encode()).digest()
        until = self._until.get(key)
        if until is None:
            return None
        if until <= now:
            del self._until[key]
            return None
        return until - now

    def note(self, endpoint: str, until: datetime) -> None:
        """``endpoint`` answered 429: back it off until ``until``."""
        if len(self._until) >= self._limit:
            kept = sorted(self._until.items(), key=lambda item: item[1])[-(self._limit // 2) :]
            self._until = dict(kept)
        self._until[hashlib.sha256(endpoint.encode()).digest()] = until


# ---------------------------------------------------------------- the provider


@dataclass(frozen=True, slots=True)
class WebPushSetup:
    """One app's checked ``[push.webpush]`` settings, ready to build a provider from."""

    settings: WebPushSettings
    key: ec.EllipticCurvePrivateKey
    name: str

    def __repr__(self) -> str:
        return f"WebPushSetup({self.name!r})"


_VAPID_SUBJECT = re.compile(r"^(mailto:[^\s@]+@[^\s@]+|https://[^\s/?#]+(/[^\s]*)?)$")
"""RFC 8292's ``sub``: a ``mailto:`` address or an ``https:`` URL to reach the operator."""


def prepare(settings: WebPushSettings, key: str) -> WebPushSetup:
    """Check one app's settings without connecting anywhere (``key`` names it)."""
    if not all(is_host_pattern(pattern) for pattern in settings.allowed_endpoints):
        raise ConfigError(
            f"{key}.allowed_endpoints: each entry is a host or *.suffix"
            " with at least one label before it"
        )
    if not settings.subject:
        raise ConfigError(f"{key}.subject: required key is missing")
    if not _VAPID_SUBJECT.fullmatch(settings.subject):
        raise ConfigError(f"{key}.subject: expected mailto:address or an https:// URL")
    ssl_context(settings.ca_file, key=f"{key}.ca_file")
    vapid = load_vapid_key(settings.vapid_private_key, f"{key}.vapid_private_key")
    return WebPushSetup(settings, vapid, key)


def build(
    setup: WebPushSetup, clock: Clock, *, ttl: timedelta, resolver: Resolver | None = None
) -> WebPushProvider:
    """The provider of one checked app: its own VAPID tokens and connections."""
    return WebPushProvider(
        key=setup.key,
        subject=setup.settings.subject,
        allowed_endpoints=setup.settings.allowed_endpoints,
        allow_private_addresses=setup.settings.allow_private_addresses,
        clock=clock,
        ttl=ttl,
        resolver=resolver,
        ca_file=setup.settings.ca_file,
        config_key=setup.name,
    )


class WebPushProvider:
    """Sends Web Push; see the module docstring for requests and outcomes.

    Args:
        key: the VAPID private key.
        subject: ``push.webpush.subject`` (``mailto:`` or ``https:``).
        allowed_endpoints: hosts a subscription may name (exact or ``*.suffix``).
        allow_private_addresses: allow non-public push services (tests).
        clock: the injected clock (JWT ``exp``, subscription expiry, Retry-After).
        ttl: ``push.max_age``, sent as ``TTL``.
        resolver: name resolution (the system's by default).
        ca_file: CA bundle for the push services (empty: the system's CAs).
        config_key: the block that configured it (``push.webpush`` or an app's), named
            in the lines that say what to check.
        request_bound: seconds a resolution plus request may take.
    """

    name = "webpush"
    bounds_every_send = True
    """Every send ends within its bound (a scope around the resolution, libcurl's timer
    around the request); see ``push/registry.py``."""

    def __init__(
        self,
        *,
        key: ec.EllipticCurvePrivateKey,
        subject: str,
        allowed_endpoints: Sequence[str],
        clock: Clock,
        ttl: timedelta = timedelta(hours=1),
        allow_private_addresses: bool = False,
        resolver: Resolver | None = None,
        ca_file: str = "",
        config_key: str = "push.webpush",
        request_bound: float = REQUEST_BOUND,
    ) -> None:
        self.vapid = VapidTokens(key, subject, clock)
        self._allowed = tuple(allowed_endpoints)
        self._allow_private = allow_private_addresses
        self._clock = clock
        self._ttl = str(max(0, int(ttl.total_seconds())))
        self._resolver = resolver or SystemResolver()
        self._bound = request_bound
        self._key = config_key
        ssl_context(ca_file, key=f"{config_key}.ca_file")  # a bad CA file fails here
        self._client = Http2Client(
            ca_file=ca_file, name="webpush", max_host_connections=HOST_CONNECTIONS
        )
        self._throttle = LogThrottle()
        self._lookups = SharedLookups(self._resolver)
        self.backoff = EndpointBackoff()

    def __repr__(self) -> str:
        return f"WebPushProvider(allowed_endpoints={len(self._allowed)})"

    @property
    def public_key(self) -> str:
        """The VAPID public key in base64url (``GET /v1/webpush/key``)."""
        return self.vapid.public_key

    async def check_registration(
        self, token: str, secret: str | None = None
    ) -> tuple[str, str] | None:
        """Refuse an endpoint whose host is not in ``allowed_endpoints``."""
        await trio.lowlevel.checkpoint()
        endpoint = parse_endpoint(token)
        if _endpoint_url(token) is None or endpoint is None:
            return ("subscription.endpoint", "expected an https URL without credentials")
        if not host_allowed(endpoint.host, self._allowed):
            return (
                "subscription.endpoint",
                f"the push service's host is not in {self._key}.allowed_endpoints",
            )
        return None

    def headers(self, message: Message, origin: str) -> list[str]:
        """The request headers of ``message`` to a push service at ``origin``."""
        out = [
            f"ttl: {self._ttl}",
            f"urgency: {urgency_of(message)}",
            "content-encoding: aes128gcm",
            "content-type: application/octet-stream",
            f"authorization: {self.vapid.authorization(origin)}",
        ]
        if isinstance(message, TopicMessage):
            out.append(f"topic: {topic_header(message.topic)}")
        else:
            group = getattr(message, "group", None)
            if group is not None:
                out.append(f"topic: {group}")
        return out

    @staticmethod
    def body(message: Message) -> bytes:
        """The clear body: the content-free payload every provider sends."""
        return orjson.dumps(message.payload())

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send one push; never raises for a push service or network problem.

        Cancellation abandons the request (the connection stays usable).
        """
        if target.expires_at is not None and self._clock.now() >= target.expires_at:
            return Outcome.dead(EXPIRED)
        # Parsed again (cached): a registration stored before the one spelling, or with a
        # port outside 1-65535, is read the way a new one would be.
        endpoint = parse_endpoint(target.token)
        if endpoint is None:
            return Outcome.rejected("not_https")
        host, port = endpoint.host, endpoint.port
        keys = unpack_keys(target.signing_key)
        if keys is None:
            return Outcome.rejected("bad_subscription_keys")
        waiting = self.backoff.left(endpoint.url, self._clock.now())
        if waiting is not None:
            # The endpoint asked us to slow down: not contacted before its Retry-After.
            return Outcome.transient(RATE_LIMITED, waiting)
        if not host_allowed(host, self._allowed):
            if self._throttle.allow(NOT_ALLOWED):
                log.warning(
                    "a Web Push endpoint's host is no longer in %s.allowed_endpoints: it was"
                    " not contacted and its registration is kept",
                    self._key,
                    extra={"key": f"{self._key}.allowed_endpoints", "reason": NOT_ALLOWED},
                )
            return Outcome.rejected(NOT_ALLOWED)
        deadline = trio.current_time() + self._bound
        try:
            addresses = await self._lookups.resolve(host, port, deadline)
        except ResolveError:
            return Outcome.transient("dns_error", RETRY_MINIMUM, ours=True)
        if addresses is None:
            return Outcome.transient("timeout", RETRY_MINIMUM, ours=True)
        if not self._allow_private and any(is_blocked_address(a) for a in addresses):
            # Logged with what to check by the token lifecycle (rejections).
            return Outcome.rejected("private_address")
        try:
            content = encrypt(self.body(message), *keys)
        except (ValueError, http_ece.ECEException):
            return Outcome.rejected("bad_subscription_keys")
        if len(content) > BODY_MAX:
            return Outcome.rejected("too_large")
        answer = await self._client.request(
            endpoint.url,
            self.headers(message, endpoint.origin),
            content,
            bound=max(0.001, deadline - trio.current_time()),
            connect_to=connect_to(host, port, addresses[0]),
        )
        if isinstance(answer, NoAnswer):
            return webpush_outcome(answer)
        now = self._clock.now()
        outcome = webpush_outcome(
            answer.status, parse_retry_after(answer.header("retry-after"), now)
        )
        if answer.status == 429 and outcome.retry_after is not None:
            self.backoff.note(endpoint.url, now + outcome.retry_after)
        if answer.status in OUR_MISTAKE and self._throttle.allow(outcome.reason):
            log.warning(
                "a Web Push service refused our request (HTTP %d): check %s.vapid_private_key"
                " (the page must subscribe with its public key, GET /v1/webpush/key) and"
                " %s.subject; the registration is kept",
                answer.status,
                self._key,
                self._key,
                extra={"key": self._key, "reason": outcome.reason},
            )
        return outcome

    async def aclose(self) -> None:
        """Close the connections."""
        await self._client.aclose()


# ---------------------------------------------------------------- what to check

HINTS: dict[str, str] = {
    "private_address": (
        "the push service's host resolves to a private or local address, refused unless"
        " push.webpush.allow_private_addresses"
    ),
    "http_413": "the push service found the push too large: check the lengths of the IDs",
    "bad_subscription_keys": "a stored subscription's keys are not a P-256 point and 16 bytes",
    "redirect": "the push service answered with a redirect, which is never followed",
}
"""What to check, by the reason of a rejection (logged by the token lifecycle)."""
REJECTION_HINT = "the push service refused the message"
"""Said for a rejection without a hint of its own."""
EXPLAINED = frozenset({NOT_ALLOWED, "http_400", "http_401", "http_403"})
"""Rejections this module logs itself (naming the app's keys)."""
