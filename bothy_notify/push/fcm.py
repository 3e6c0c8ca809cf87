"""The FCM HTTP v1 provider, authenticated as a service account (OAuth2 JWT bearer).

Requests: ``POST {endpoint}/v1/projects/{project_id}/messages:send`` with a
cached OAuth2 access token, a data-only message whose every value is a string
(``urgency`` among them, so the app picks its notification channel; ``tag``,
the thread's grouping value, so it groups a conversation's notifications),
``android.priority`` NORMAL for a ``low`` urgency and HIGH otherwise, and for
Apple devices the APNs headers ``apns-priority: 5`` and ``apns-push-type: background`` with
``content-available``. The project id and the token endpoint come from the
service-account JSON; ``push.fcm.ca_file`` is trusted for both the FCM
endpoint and the token endpoint.

Answers become outcomes here and nowhere else, in this order (SPEC section 10):

1. 200: delivered.
2. HTTP 429, a typed ``google.rpc.QuotaFailure`` detail or FcmError
   ``QUOTA_EXCEEDED``: transient, no retry before 60 s.
3. HTTP 5xx (500 and 503 by name), whatever the body says or fails to say:
   transient, 10 s minimum.
4. Typed FcmError ``UNREGISTERED``: dead. ``SENDER_ID_MISMATCH``: mismatch.
   ``UNAVAILABLE``/``INTERNAL``: transient (10 s minimum).
5. Everything else, ``INVALID_ARGUMENT`` included: rejected (a payload bug
   must never delete registrations).

No answer at all (timeout, connection, DNS, TLS or protocol error) is
transient, 10 s minimum, and ``ours``, like a failing token endpoint: they
never count as a strike. Sends share one HTTP/2 connection
(:class:`~.http2.Http2Client`: libcurl driven by Trio).

Access tokens (:class:`ServiceAccountTokens`): RFC 7523's JWT bearer grant, the
grant google-auth makes for a service account. An assertion signed RS256 with
the account's key (``iss`` its e-mail, ``scope`` firebase.messaging, ``aud``
Google's token endpoint, an hour's lifetime from the host's wall clock, which is
what the endpoint checks it against) is POSTed as a form to the account's
``token_uri`` through the same client as the sends, bounded by
:data:`~.transport.REQUEST_BOUND`. The answer becomes a token or an error here
(:func:`token_from_answer`), and the error never holds the answer, the
assertion or the key:

=============================================  =================================
the answer                                     becomes
=============================================  =================================
2xx with an ``access_token``                   the token, cached until 5 min
                                               before ``expires_in`` (an hour
                                               without one)
no answer; 408, 429 or 5xx; an OAuth2          :class:`TokenUnavailable`: the
``error`` ``temporarily_unavailable``,         send is transient
``server_error`` or ``internal_failure``; a    (``token_unavailable``)
2xx without a token or that is not JSON
any other status (``invalid_grant``...)        :class:`TokenRefused`: the send
                                               is rejected (``token_refused``)
=============================================  =================================

A longer ``Retry-After`` is honoured up to 300 s. A 401 means the access token
was refused: it is dropped, a new one fetched and the message resent once
within the same deadline; a second 401 is rejected. Rejections are logged
with what to check by the token lifecycle (:mod:`bothy_notify.notify.lifecycle`).

Access-token errors (module hierarchy)::

    AccessTokenError          no access token could be had
    ├── TokenUnavailable      the token endpoint could not be reached or timed out
    │                         (the send is transient)
    └── TokenRefused          the token endpoint refused the service account
                              (the send is rejected; the log names the key)
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import urlencode

import jwt
import orjson
import trio
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bothy_notify.config import ConfigError, FcmSettings
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.http2 import Http2Client
from bothy_notify.push.port import Message, Outcome, Target, Unresolved
from bothy_notify.push.transport import (
    REQUEST_BOUND,
    LogThrottle,
    NoAnswer,
    ProviderAnswer,
    check_https_url,
    parse_retry_after,
    retry_delay,
    safe_reason,
    ssl_context,
)

log = logging.getLogger("bothy.push.fcm")

FCM_ENDPOINT = "https://fcm.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
QUOTA_MINIMUM = timedelta(seconds=60)
"""Earliest retry after a quota failure (FCM denylists senders that retry sooner)."""
TRANSIENT_MINIMUM = timedelta(seconds=10)
"""Earliest retry after any other transient FCM failure."""
REFRESH_MARGIN = timedelta(minutes=5)
"""An access token is replaced this long before it expires."""
ASSERTION_AUDIENCE = "https://oauth2.googleapis.com/token"
"""The ``aud`` of the grant's assertion: Google's token endpoint, whatever the
account's ``token_uri`` (as google-auth has it)."""
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
"""RFC 7523's grant type."""
ASSERTION_LIFETIME = 3600
"""Seconds an assertion is valid (Google's most)."""
DEFAULT_TOKEN_LIFETIME = timedelta(hours=1)
"""An access token's lifetime when the endpoint does not say (``expires_in``)."""
_UNAVAILABLE_STATUSES = frozenset({408, 429})
"""Statuses below 500 that say "try again later", not "refused"."""
_UNAVAILABLE_ERRORS = frozenset({"temporarily_unavailable", "server_error", "internal_failure"})
"""OAuth2 ``error`` codes of a token endpoint that failed rather than refused."""

_FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_SERVICE_ACCOUNT_FIELDS = ("project_id", "client_email", "private_key", "token_uri")


class AccessTokenError(Exception):
    """No access token could be had (the message names no secret)."""


class TokenUnavailable(AccessTokenError):
    """The token endpoint could not be reached, failed, or did not answer in time."""


class TokenRefused(AccessTokenError):
    """The token endpoint refused the service account (a credentials problem)."""


class AccessTokens(Protocol):
    """OAuth2 access tokens for FCM."""

    async def token(self) -> str:
        """A valid access token, fetched when none is cached or it nears expiry.

        Raises :class:`TokenUnavailable` or :class:`TokenRefused`. The caller
        bounds the wait; cancellation abandons the fetch (its request is reset).
        """
        ...

    def invalidate(self, token: str) -> None:
        """Forget ``token`` if it is the cached one (the endpoint refused it)."""
        ...

    def peek(self) -> str | None:
        """The cached token when it is still fresh, else ``None``; never waits."""
        ...


class StaticAccessTokens:
    """An in-memory :class:`AccessTokens`: always the same token (unit tests)."""

    def __init__(self, value: str = "static-token") -> None:
        self._value = value
        self.invalidated = 0

    async def token(self) -> str:
        await trio.lowlevel.checkpoint()
        return self._value

    def invalidate(self, token: str) -> None:
        self.invalidated += 1

    def peek(self) -> str | None:
        return self._value

    def __repr__(self) -> str:
        return "StaticAccessTokens(***)"


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """A parsed service-account JSON and its private key. The repr shows no key and
    no e-mail."""

    info: dict[str, Any]
    key: rsa.RSAPrivateKey

    @property
    def project_id(self) -> str:
        return str(self.info["project_id"])

    @property
    def token_uri(self) -> str:
        return str(self.info["token_uri"])

    @property
    def client_email(self) -> str:
        return str(self.info["client_email"])

    @property
    def key_id(self) -> str | None:
        """The key's id (``private_key_id``), sent as the assertion's ``kid``."""
        found = self.info.get("private_key_id")
        return found if isinstance(found, str) and found else None

    def __repr__(self) -> str:
        return "ServiceAccount(***)"


def load_service_account(text: str, key: str = "push.fcm.service_account") -> ServiceAccount:
    """Check a service account (``key`` names it: ``push.fcm.service_account`` or an
    app's); raise :class:`ConfigError` naming the key."""
    try:
        info = json.loads(text)
    except ValueError:
        raise ConfigError(f"{key}: not valid JSON (expected the service-account file)") from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ConfigError(f'{key}: not a service-account JSON (its "type" must be service_account)')
    for field in _SERVICE_ACCOUNT_FIELDS:
        if not isinstance(info.get(field), str) or not info[field]:
            raise ConfigError(f'{key}: the service-account JSON has no "{field}"')
    check_https_url(info["token_uri"], key=f"{key} (token_uri)")
    try:
        private = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        private = None
    if not isinstance(private, rsa.RSAPrivateKey):
        raise ConfigError(f"{key}: its private_key is not a usable RSA key") from None
    return ServiceAccount(info, private)


def token_from_answer(answer: ProviderAnswer | NoAnswer) -> tuple[str, timedelta]:
    """The access token and its lifetime from the token endpoint's answer; pure.

    Raises :class:`TokenUnavailable` or :class:`TokenRefused` (see the module
    docstring); their messages are constant: nothing of the answer is kept.
    """
    if isinstance(answer, NoAnswer):
        raise TokenUnavailable("the token endpoint could not be reached")
    try:
        body = json.loads(answer.body) if answer.body else None
    except (ValueError, UnicodeDecodeError):
        body = None
    fields = body if isinstance(body, dict) else {}
    if 200 <= answer.status <= 299:
        token = fields.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenUnavailable("the token endpoint gave no token")
        lifetime = fields.get("expires_in")
        if isinstance(lifetime, int | float) and not isinstance(lifetime, bool) and lifetime > 0:
            return token, timedelta(seconds=lifetime)
        return token, DEFAULT_TOKEN_LIFETIME
    if (
        answer.status >= 500
        or answer.status in _UNAVAILABLE_STATUSES
        or fields.get("error") in _UNAVAILABLE_ERRORS
    ):
        raise TokenUnavailable("the token endpoint failed")
    raise TokenRefused("the token endpoint refused the service account")


class ServiceAccountTokens:
    """Access tokens of a service account (RFC 7523's JWT bearer grant), cached until
    near expiry; see the module docstring.

    Args:
        account: the service account.
        clock: the injected clock (when a cached token expires).
        client: the HTTP/2 client the token endpoint is asked through (the
            provider's own: its CA bundle is ``push.fcm.ca_file``).
        request_bound: seconds the token request may take.

    One fetch at a time; callers waiting meanwhile get its token.
    """

    def __init__(
        self,
        account: ServiceAccount,
        *,
        clock: Clock,
        client: Http2Client,
        request_bound: float = REQUEST_BOUND,
    ) -> None:
        self._account = account
        self._clock = clock
        self._client = client
        self._bound = request_bound
        self._lock = trio.Lock()
        self._token: str | None = None
        self._expires_at: datetime | None = None
        self.fetched = 0

    def __repr__(self) -> str:
        return f"ServiceAccountTokens(fetched={self.fetched})"

    def _fresh(self) -> str | None:
        if self._token is None or self._expires_at is None:
            return None
        if self._clock.now() >= self._expires_at - REFRESH_MARGIN:
            return None
        return self._token

    async def token(self) -> str:
        cached = self._fresh()
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._fresh()
            if cached is not None:
                return cached
            answer = await self._client.request(
                self._account.token_uri,
                ["content-type: application/x-www-form-urlencoded", "accept: application/json"],
                urlencode({"grant_type": JWT_BEARER, "assertion": self.assertion()}).encode(),
                bound=self._bound,
            )
            token, lifetime = token_from_answer(answer)
            self._token = token
            self._expires_at = self._clock.now() + lifetime
            self.fetched += 1
            return token

    def assertion(self) -> str:
        """A signed assertion of the grant (RS256), issued now by the host's wall clock:
        the token endpoint checks ``iat`` and ``exp`` against its own."""
        account = self._account
        issued = int(time.time())
        claims = {
            "iss": account.client_email,
            "scope": SCOPE,
            "aud": ASSERTION_AUDIENCE,
            "iat": issued,
            "exp": issued + ASSERTION_LIFETIME,
        }
        headers = {"kid": account.key_id} if account.key_id is not None else None
        return jwt.encode(claims, account.key, algorithm="RS256", headers=headers)

    def invalidate(self, token: str) -> None:
        if token == self._token:
            self._token = None
            self._expires_at = None

    def peek(self) -> str | None:
        return self._fresh()


def _details(body: bytes) -> tuple[str, list[str], bool]:
    """(error.status, FcmError codes, has a QuotaFailure detail) of an error body; lenient."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return "", [], False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return "", [], False
    status = safe_reason(error.get("status"), "")
    codes: list[str] = []
    quota = False
    details = error.get("details")
    for detail in details if isinstance(details, list) else []:
        if not isinstance(detail, dict):
            continue
        kind = detail.get("@type")
        if kind == _FCM_ERROR:
            code = safe_reason(detail.get("errorCode"), "")
            if code:
                codes.append(code)
        elif kind == _QUOTA_FAILURE:
            quota = True
    return status, codes, quota


def fcm_outcome(
    status: int | NoAnswer, body: bytes = b"", retry_after: timedelta | None = None
) -> Outcome:
    """The outcome of one FCM answer, or of no answer (:class:`~.transport.NoAnswer`:
    transient with its reason); pure. See the module docstring for the order."""
    if isinstance(status, NoAnswer):
        # No answer from FCM: nothing is known about this token.
        return Outcome.transient(status.reason, TRANSIENT_MINIMUM, ours=True)
    if status == 200:
        return Outcome.delivered()
    error_status, codes, quota = _details(body)
    if status == 429 or quota or "QUOTA_EXCEEDED" in codes:
        reason = "QUOTA_EXCEEDED" if (quota or "QUOTA_EXCEEDED" in codes) else "http_429"
        return Outcome.transient(reason, retry_delay(QUOTA_MINIMUM, retry_after))
    if 500 <= status <= 599:
        return Outcome.transient(f"http_{status}", retry_delay(TRANSIENT_MINIMUM, retry_after))
    if "UNREGISTERED" in codes:
        return Outcome.dead("UNREGISTERED")
    if "SENDER_ID_MISMATCH" in codes:
        return Outcome.mismatch("SENDER_ID_MISMATCH")
    for code in codes:
        if code in ("UNAVAILABLE", "INTERNAL"):
            return Outcome.transient(code, retry_delay(TRANSIENT_MINIMUM, retry_after))
    return Outcome.rejected(codes[0] if codes else error_status or f"http_{status}")


@dataclass(frozen=True, slots=True)
class FcmSetup:
    """One app's checked ``[push.fcm]`` settings, ready to build a provider from."""

    settings: FcmSettings
    account: ServiceAccount
    endpoint: str

    def __repr__(self) -> str:
        return "FcmSetup(***)"


def prepare(settings: FcmSettings, key: str) -> FcmSetup:
    """Check one app's settings without connecting anywhere (``key`` names it in errors)."""
    endpoint = FCM_ENDPOINT
    if settings.endpoint:
        endpoint = check_https_url(settings.endpoint, key=f"{key}.endpoint")
    ssl_context(settings.ca_file, key=f"{key}.ca_file")
    secret = settings.service_account
    if secret is None:
        raise ConfigError(f"{key}.service_account: required key is missing")
    if not secret.is_resolved:
        raise Unresolved(f"{key}.service_account")
    account = load_service_account(secret.reveal(), f"{key}.service_account")
    return FcmSetup(settings, account, endpoint)


def build(setup: FcmSetup, clock: Clock) -> FcmProvider:
    """The provider of one checked app: its own connections and access tokens, the
    token endpoint asked through the same client as the sends."""
    client = Http2Client(ca_file=setup.settings.ca_file, name="fcm")
    return FcmProvider(
        project_id=setup.account.project_id,
        tokens=ServiceAccountTokens(setup.account, clock=clock, client=client),
        clock=clock,
        endpoint=setup.endpoint,
        ca_file=setup.settings.ca_file,
        client=client,
    )


class FcmProvider:
    """Sends to FCM HTTP v1; see the module docstring for requests and outcomes.

    Args:
        project_id: the Firebase project (from the service account).
        tokens: access tokens.
        clock: the injected clock (Retry-After dates).
        endpoint: the FCM base URL.
        ca_file: CA bundle for the endpoint (empty: the system's CAs).
        request_bound: seconds a token fetch, and separately a send, may take.
        client: the HTTP/2 client to send through (one of its own when not given);
            closed with the provider.
    """

    name = "fcm"
    bounds_every_send = True
    """Every request ends within its bound (libcurl's timer); see ``push/registry.py``."""

    def __init__(
        self,
        *,
        project_id: str,
        tokens: AccessTokens,
        clock: Clock,
        endpoint: str = FCM_ENDPOINT,
        ca_file: str = "",
        request_bound: float = REQUEST_BOUND,
        client: Http2Client | None = None,
    ) -> None:
        self._url = f"{endpoint.rstrip('/')}/v1/projects/{project_id}/messages:send"
        self._project_id = project_id
        self.tokens = tokens
        self._clock = clock
        self._bound = request_bound
        ssl_context(ca_file, key="push.fcm.ca_file")  # a bad CA file fails here, naming the key
        self._client = client or Http2Client(ca_file=ca_file, name="fcm")
        self._throttle = LogThrottle()

    @classmethod
    def from_config(
        cls, config: FcmSettings, *, clock: Clock, key: str = "push.fcm"
    ) -> FcmProvider:
        """Build from ``[push.fcm]`` (or one of its apps); raises :class:`ConfigError`
        naming a bad key."""
        return build(prepare(config, key), clock)

    def __repr__(self) -> str:
        return "FcmProvider()"

    @staticmethod
    def message(target: Target, message: Message) -> dict[str, Any]:
        """The v1 request body: data-only, strings only, on Android priority NORMAL for
        a ``low`` urgency (a clearing push, a summary) and HIGH otherwise, 5 on Apple.

        A push about a thread carries its grouping value (:mod:`.grouping`, an HMAC,
        never the id) as the data member ``tag``, the app's notification tag and
        group on Android, and as ``apns-collapse-id`` for Apple devices. Never an
        Android ``collapse_key``: FCM keeps at most four per device and may drop
        the pending pushes of any other thread beyond them."""
        low = getattr(message, "urgency", None) == "low"
        data = message.string_payload()
        apns_headers = {"apns-priority": "5", "apns-push-type": "background"}
        group = getattr(message, "group", None)
        if group is not None:
            data["tag"] = group
            apns_headers["apns-collapse-id"] = group
        return {
            "message": {
                "token": target.token,
                "data": data,
                "android": {"priority": "NORMAL" if low else "HIGH"},
                "apns": {
                    "headers": apns_headers,
                    "payload": {"aps": {"content-available": 1}},
                },
            }
        }

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send one push; never raises for an FCM, token or network problem.

        Cancellation abandons the request (and a token fetch).
        """
        content = orjson.dumps(self.message(target, message))
        token = await self._token()
        if isinstance(token, Outcome):
            return token
        # The send, resend included, within one bound (libcurl keeps it per request);
        # a token fetch has its own.
        deadline = trio.current_time() + self._bound
        resent = False
        while True:
            left = deadline - trio.current_time()
            if left <= 0:
                return fcm_outcome(NoAnswer("timeout"))
            answer = await self._client.request(
                self._url,
                [f"authorization: Bearer {token}", "content-type: application/json"],
                content,
                bound=left,
            )
            if isinstance(answer, NoAnswer):
                return fcm_outcome(answer)
            if answer.status == 401:
                self.tokens.invalidate(token)
                if not resent:
                    resent = True
                    token = await self._token()
                    if isinstance(token, Outcome):
                        return token
                    continue
                return self._refused("UNAUTHENTICATED")
            if answer.status == 200:
                return fcm_outcome(200)  # the common case: no body to read, no Retry-After
            outcome = fcm_outcome(
                answer.status,
                answer.body,
                parse_retry_after(answer.header("retry-after"), self._clock.now()),
            )
            self._explain(outcome)
            return outcome

    async def _token(self) -> str | Outcome:
        cached = self.tokens.peek()
        if cached is not None:
            return cached  # the common case: no fetch, so no bound to set
        # Our own token fetch failing says nothing about the registration: ``ours``.
        with trio.move_on_after(self._bound):
            try:
                return await self.tokens.token()
            except TokenUnavailable:
                return Outcome.transient("token_unavailable", TRANSIENT_MINIMUM, ours=True)
            except TokenRefused:
                return self._refused("token_refused")
        return Outcome.transient("token_timeout", TRANSIENT_MINIMUM, ours=True)

    def _refused(self, reason: str) -> Outcome:
        # Logged with what to check (push.fcm.service_account) by the token lifecycle.
        return Outcome.rejected(reason)

    def _explain(self, outcome: Outcome) -> None:
        if outcome.reason == "SENDER_ID_MISMATCH" and self._throttle.allow(outcome.reason):
            log.warning(
                "FCM says the registration token belongs to another Firebase project than"
                " %s; check the shipped build's google-services.json / GoogleService-Info.plist"
                " (not the device)",
                self._project_id,
                extra={"project": self._project_id, "reason": outcome.reason},
            )

    async def aclose(self) -> None:
        """Close the connections (the token endpoint's with them)."""
        await self._client.aclose()


# ---------------------------------------------------------------- what to check

HINTS: dict[str, str] = {
    "INVALID_ARGUMENT": (
        "FCM refused the message as malformed: check the payload (every data value a"
        " string, no reserved key such as from or gcm.*), its size (4 KB) and that the"
        " token is an FCM registration token"
    ),
    "THIRD_PARTY_AUTH_ERROR": (
        "the APNs key or certificate in the Firebase project is missing or invalid:"
        " check the project's Cloud Messaging settings for Apple apps"
    ),
    "PERMISSION_DENIED": (
        "the service account may not send for this project: check its role and that"
        " the FCM API is enabled"
    ),
    "UNAUTHENTICATED": "FCM refused the access token: check push.fcm.service_account",
    "token_refused": (
        "the token endpoint refused the service account: check push.fcm.service_account"
        " (the key may be disabled or deleted)"
    ),
    "token_unavailable": "the token endpoint could not be reached",
    "token_timeout": "the token endpoint did not answer in time",
}
"""What to check, by the reason of a rejection (logged by the token lifecycle)."""
REJECTION_HINT = "FCM refused the message: look the reason up in FCM's error codes"
"""Said for a rejection without a hint of its own."""
MISMATCH_HINT = (
    "check that the shipped build's google-services.json / GoogleService-Info.plist is"
    " for the service account's Firebase project (the device is fine)"
)
"""What ``push test`` says about a mismatch."""
