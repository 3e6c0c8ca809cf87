"""The webhook provider: a signed HTTPS POST to a server recipient's URL.

A webhook registration's token is its ``https://`` URL and it carries its own
signing key. Requests follow Standard Webhooks: ``webhook-id`` (the hint's
``nid``, the same on every retry), ``webhook-timestamp`` (Unix seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256(key, id.timestamp.body)>``. The
body is the content-free payload plus ``user_id`` and ``registration_id``,
since a server recipient has no other way to know whom the hint is for.

Where a webhook may go:

- at registration (:meth:`WebhookProvider.check_registration`): the host must
  match ``push.webhook.allowed_domains`` and resolve to public addresses only;
- before every attempt the host must still match the current
  ``allowed_domains`` (a host removed from it is not contacted: the outcome is
  ``rejected``, never invalidating, logged once a minute naming the key), and
  is resolved again: any address the registries' table (:mod:`.addresses`)
  does not call globally reachable, IPv4 embedded in IPv6 judged as IPv4,
  refuses the send, unless ``allow_private_addresses``. The connection then goes to the address that
  was checked (TLS still verifies, and ``Host`` still names, the URL's host),
  so a DNS answer that changes between check and connect cannot redirect it.
  With ``push.webhook.endpoint`` (an egress proxy) the proxy is asked to
  connect to that checked address.

Answers become outcomes here and nowhere else: 2xx delivered; 404/410 dead
only when every attempt of the send answered so (until then transient,
retried); redirects and other 4xx rejected; 5xx, timeout and connection
errors transient (1 s minimum). No redirect is followed. The host is the
registration's own, so its DNS, connection and timeout failures are about the
registration (they may count as strikes while other webhooks deliver); only a
failing egress proxy is ``ours``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
import trio

from bothy_notify.config import ConfigError, WebhookConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.pinned import PinnedBackend
from bothy_notify.push.port import (
    PLAIN_TOKEN,
    Message,
    Outcome,
    PushMessage,
    Refusal,
    Registrant,
    Target,
    TopicDelivery,
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
    ssl_context,
    transport_reason,
)

log = logging.getLogger("bothy.push.webhook")

TOKEN_MAX = 2048
"""Longest webhook URL: what browsers and proxies reliably carry."""
NOT_ALLOWED = "domain_not_allowed"
"""The reason of a send refused because its host left ``push.webhook.allowed_domains``."""
RETRY_MINIMUM = timedelta(seconds=1)
"""Earliest retry after a transient webhook failure."""
GONE_STATUSES = frozenset({404, 410})
_NETWORK_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
    ssl.SSLError,
    OSError,
)
KEY_BYTES = (16, 64)
"""Signing keys are 16 to 64 bytes (base64, optionally ``whsec_``-prefixed)."""


def decode_signing_key(text: str | None) -> bytes | None:
    """The raw bytes of a signing key, or ``None`` when it is not base64 of 16 to 64 bytes."""
    if not text:
        return None
    try:
        raw = base64.b64decode(text.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if KEY_BYTES[0] <= len(raw) <= KEY_BYTES[1] else None


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` and base64 of the HMAC-SHA256."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def webhook_outcome(status: int, target: Target) -> Outcome:
    """The outcome of one webhook answer; pure.

    404 and 410 are dead only when every attempt of this send answered so: the
    streak is carried by the registration (its error since its last delivery,
    ``target.last_error``, is ``http_404`` or ``http_410``). Until the last
    attempt they are transient, so they are retried.
    """
    if 200 <= status <= 299:
        return Outcome.delivered()
    if status in GONE_STATUSES:
        code = f"http_{status}"
        streak = target.attempt <= 1 or target.last_error in ("http_404", "http_410")
        if not streak:
            return Outcome.transient(f"{code}_after_other_errors", RETRY_MINIMUM)
        if target.attempt >= target.max_attempts:
            return Outcome.dead(code)
        return Outcome.transient(code, RETRY_MINIMUM)
    if 300 <= status <= 399:
        return Outcome.rejected("redirect")
    if 500 <= status <= 599:
        return Outcome.transient(f"http_{status}", RETRY_MINIMUM)
    return Outcome.rejected(f"http_{status}")


class WebhookProvider:
    """Sends signed webhooks; see the module docstring.

    Args:
        allowed_domains: ``push.webhook.allowed_domains`` (checked at registration).
        allow_private_addresses: allow non-public targets (tests, private networks).
        resolver: name resolution (the system's by default).
        clock: the injected clock (``webhook-timestamp``).
        ca_file: CA bundle for the receivers' TLS (empty: the system's CAs).
        proxy: an egress proxy URL (``push.webhook.endpoint``), or empty.
        request_bound: seconds a resolution plus request may take.
    """

    name = "webhook"

    def __init__(
        self,
        *,
        allowed_domains: Sequence[str],
        clock: Clock,
        allow_private_addresses: bool = False,
        resolver: Resolver | None = None,
        ca_file: str = "",
        proxy: str = "",
        request_bound: float = REQUEST_BOUND,
    ) -> None:
        self._allowed = tuple(allowed_domains)
        self._allow_private = allow_private_addresses
        self._resolver = resolver or SystemResolver()
        self._clock = clock
        self._bound = request_bound
        self._ssl = ssl_context(ca_file, key="push.webhook.ca_file")
        self._ssl.set_alpn_protocols(["http/1.1"])
        self._proxy = httpx.URL(proxy) if proxy else None
        self._proxy_ssl = ssl_context(ca_file, key="push.webhook.ca_file") if proxy else None
        self._throttle = LogThrottle()

    @classmethod
    def from_config(
        cls, config: WebhookConfig, *, clock: Clock, resolver: Resolver | None = None
    ) -> WebhookProvider:
        """Build from ``[push.webhook]``; raises :class:`ConfigError` naming a bad key."""
        return build(prepare(config, "push.webhook"), clock, resolver)

    def __repr__(self) -> str:
        return f"WebhookProvider(allowed_domains={len(self._allowed)})"

    async def check_registration(
        self, token: str, secret: str | None = None
    ) -> tuple[str, str] | None:
        """Refuse a webhook URL whose host is not allowed or resolves to a blocked address.

        Returns the field and a constant problem (never the URL), or ``None``.
        Bounded by :data:`~.transport.REQUEST_BOUND`.
        """
        url = _parse(token)
        if url is None:
            return ("token", "expected an https URL")
        if not host_allowed(url.host, self._allowed):
            return ("token", "the host is not in push.webhook.allowed_domains")
        with trio.move_on_after(self._bound):
            try:
                addresses = await self._resolver.resolve(url.host, url.port or 443)
            except ResolveError:
                return ("token", "the host could not be resolved")
            if not self._allow_private and any(is_blocked_address(a) for a in addresses):
                return ("token", "the host resolves to a private or local address")
            return None
        return ("token", "the host could not be resolved in time")

    def body(self, target: Target, message: Message) -> bytes:
        """The JSON body: the payload plus ``user_id`` and ``registration_id``; a topic
        push adds ``recipient_id`` (hex) instead."""
        if isinstance(message, TopicMessage):
            return json.dumps(message.webhook_body(), separators=(",", ":")).encode()
        payload = {
            **message.payload(),
            "user_id": target.user_id,
            "registration_id": target.registration_id,
        }
        return json.dumps(payload, separators=(",", ":")).encode()

    async def send(self, target: Target, message: Message) -> Outcome:
        """Resolve, check, connect to the checked address, POST; never raises for a
        receiver or network problem. Cancellation abandons the request."""
        url = _parse(target.token)
        if url is None:
            return Outcome.rejected("not_https")
        if not host_allowed(url.host, self._allowed):
            # Our configuration changed since the registration: never contacted, kept.
            if self._throttle.allow(NOT_ALLOWED):
                log.warning(
                    "a webhook's host is no longer in push.webhook.allowed_domains: it was"
                    " not contacted and its registration is kept; add the host back to"
                    " push.webhook.allowed_domains, or delete the registration",
                    extra={"key": "push.webhook.allowed_domains", "reason": NOT_ALLOWED},
                )
            return Outcome.rejected(NOT_ALLOWED)
        key = decode_signing_key(target.signing_key)
        if key is None:
            return Outcome.rejected("bad_signing_key")
        body = self.body(target, message)
        webhook_id = message.nid if isinstance(message, PushMessage) else message.webhook_id
        timestamp = int(self._clock.now().timestamp())
        headers = [
            (b"content-type", b"application/json"),
            (b"user-agent", b"bothy-notify"),
            (b"webhook-id", webhook_id.encode()),
            (b"webhook-timestamp", str(timestamp).encode()),
            (b"webhook-signature", sign(key, webhook_id, timestamp, body).encode()),
        ]
        with trio.move_on_after(self._bound):
            try:
                addresses = await self._resolver.resolve(url.host, url.port or 443)
            except ResolveError:
                return Outcome.transient("dns_error", RETRY_MINIMUM)
            if not self._allow_private and any(is_blocked_address(a) for a in addresses):
                # Logged with what to check by the token lifecycle (rejections).
                return Outcome.rejected("private_address")
            # A pool per send, bound to the checked address; it keeps no connection, so
            # a connection verified for one host is never reused for another.
            backend = PinnedBackend(addresses[0], proxy=self._proxy, proxy_ssl=self._proxy_ssl)
            try:
                async with (
                    httpcore.AsyncConnectionPool(
                        ssl_context=self._ssl,
                        network_backend=backend,
                        max_keepalive_connections=0,
                        http1=True,
                        http2=False,
                    ) as pool,
                    pool.stream("POST", str(url), headers=headers, content=body) as response,
                ):
                    status = response.status
            except _NETWORK_ERRORS as exc:
                # The host is the registration's own: its failure may count as a strike,
                # except when our egress proxy failed.
                reason = transport_reason(exc)
                return Outcome.transient(reason, RETRY_MINIMUM, ours=reason == "proxy_error")
            return webhook_outcome(status, target)
        return Outcome.transient("timeout", RETRY_MINIMUM)

    async def aclose(self) -> None:
        """Nothing to close: every send uses its own connection."""
        await trio.lowlevel.checkpoint()


def check_proxy_url(value: str) -> None:
    """Check ``push.webhook.endpoint`` (empty, or an http(s) proxy URL); raise
    :class:`ConfigError` naming the key otherwise."""
    if not value:
        return
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        raise ConfigError("push.webhook.endpoint: expected an http(s):// proxy URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError("push.webhook.endpoint: expected an http(s):// proxy URL")


def _parse(token: str) -> httpx.URL | None:
    try:
        url = httpx.URL(token)
    except httpx.InvalidURL:
        return None
    if url.scheme != "https" or not url.host or url.userinfo:
        return None
    return url


def prepare(settings: WebhookConfig, key: str) -> WebhookConfig:
    """Check ``[push.webhook]`` without connecting anywhere; raise :class:`ConfigError`
    naming the key."""
    if not all(is_host_pattern(pattern) for pattern in settings.allowed_domains):
        raise ConfigError(
            f"{key}.allowed_domains: each entry is a host or *.suffix"
            " with at least one label before it"
        )
    check_proxy_url(settings.endpoint)
    ssl_context(settings.ca_file, key=f"{key}.ca_file")
    return settings


def build(
    settings: WebhookConfig, clock: Clock, resolver: Resolver | None = None
) -> WebhookProvider:
    return WebhookProvider(
        allowed_domains=settings.allowed_domains,
        allow_private_addresses=settings.allow_private_addresses,
        resolver=resolver,
        clock=clock,
        ca_file=settings.ca_file,
        proxy=settings.endpoint,
    )


def is_webhook_url(token: str) -> bool:
    """A webhook token is an ``https://host[:port]/path?query`` URL of printable ASCII,
    without user info or fragment (allowed domains and addresses are the provider's
    registration check)."""
    if not PLAIN_TOKEN.fullmatch(token):
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


def registrant(body: Mapping[str, Any]) -> Registrant | Refusal:
    """A webhook registration: its https URL and its signing key (base64 of 16 to 64
    bytes, optionally ``whsec_``-prefixed; stored, never returned)."""
    token = body.get("token")
    if not isinstance(token, str) or not is_webhook_url(token):
        return Refusal("token", "expected an https URL without credentials or fragment")
    signing_key = body.get("signing_key")
    if signing_key is None:
        return Refusal("signing_key", "required for a webhook")
    if not isinstance(signing_key, str) or decode_signing_key(signing_key) is None:
        return Refusal("signing_key", "expected base64 of 16 to 64 bytes")
    return Registrant(token, environment=body.get("environment"), secret=signing_key)


def topic_delivery(body: Mapping[str, Any]) -> TopicDelivery | None:
    """Topic mode: ``url`` and a standard-base64 ``signing_key`` (their rules are
    :func:`topic_refusal`'s); neither ``token`` nor ``environment``."""
    if body.get("token") is not None or body.get("environment") is not None:
        return None
    url, key_text = body.get("url"), body.get("signing_key")
    if url is not None and not isinstance(url, str):
        return None
    key = b""
    if key_text is not None:
        if not isinstance(key_text, str):
            return None
        try:
            key = base64.b64decode(key_text, validate=True)
        except (binascii.Error, ValueError):
            return None
    return TopicDelivery(url or "", None, key)


TOPIC_URL_NOT_ALLOWED = "webhook url is not allowed"
TOPIC_KEY_LENGTH = "webhook signing key length is not allowed"


async def topic_refusal(
    delivery: TopicDelivery,
    check: Callable[[str], Awaitable[tuple[str, str] | None]] | None,
) -> str | None:
    """Topic mode's checks of a webhook (docs/topics.md, checks 6 and 7), in their
    order: the URL is https and passes the provider's registration check, then the
    key is 16 to 64 bytes; the constant message of the first that fails."""
    if not is_webhook_url(delivery.token):
        return TOPIC_URL_NOT_ALLOWED
    if check is not None and await check(delivery.token) is not None:
        return TOPIC_URL_NOT_ALLOWED
    key = delivery.signing_key
    if key is None or not KEY_BYTES[0] <= len(key) <= KEY_BYTES[1]:
        return TOPIC_KEY_LENGTH
    return None


# ---------------------------------------------------------------- what to check

HINTS: dict[str, str] = {
    "private_address": (
        "the webhook host resolves to a private or local address, refused unless"
        " push.webhook.allow_private_addresses"
    ),
    "redirect": (
        "the receiver answered with a redirect, which is never followed: register the final URL"
    ),
    "bad_signing_key": "a stored signing key is not base64 of 16 to 64 bytes",
    "http_404": "the receiver answered 404: check the webhook URL",
    "http_410": "the receiver answered 410: check the webhook URL",
    "http_401": (
        "the receiver refused the webhook: check that it verifies the signature with the"
        " registered signing key"
    ),
    "http_403": (
        "the receiver refused the webhook: check that it verifies the signature with the"
        " registered signing key"
    ),
}
"""What to check, by the reason of a rejection (logged by the token lifecycle)."""
REJECTION_HINT = "the receiver refused the webhook: check that it accepts the payload"
"""Said for a rejection without a hint of its own."""
EXPLAINED = frozenset({NOT_ALLOWED})
"""Rejections this module logs itself (naming ``push.webhook.allowed_domains``)."""
