"""The FCM HTTP v1 provider, authenticated as a service account through google-auth.

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
(:class:`~.http2.Http2Client`: libcurl in one thread); the token endpoint is
called through google-auth in a worker thread.

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
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import google.auth.exceptions
import orjson
import requests
import trio
from google.auth.transport.requests import Request as GoogleRequest
from google.oauth2 import service_account

from bothy_notify.config import ConfigError, FcmSettings
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.http2 import Http2Client
from bothy_notify.push.port import Message, Outcome, Target, Unresolved
from bothy_notify.push.transport import (
    REQUEST_BOUND,
    LogThrottle,
    NoAnswer,
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
        bounds the wait; cancellation abandons the fetch (it finishes in its
        worker thread and is discarded).
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
    """A parsed service-account JSON. The repr shows no key and no e-mail."""

    info: dict[str, Any]

    @property
    def project_id(self) -> str:
        return str(self.info["project_id"])

    @property
    def token_uri(self) -> str:
        return str(self.info["token_uri"])

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
        service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=[SCOPE]
        )
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"{key}: its private_key is not a usable RSA key") from None
    return ServiceAccount(info)


class GoogleAccessTokens:
    """Access tokens from a service account via google-auth, cached until near expiry.

    The refresh is a blocking HTTP call; it runs in a worker thread, one at a
    time, bounded by :data:`~.transport.REQUEST_BOUND` inside the thread too.
    ``ca_file`` is trusted for the token endpoint.
    """

    def __init__(self, account: ServiceAccount, *, clock: Clock, ca_file: str = "") -> None:
        self._credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            account.info, scopes=[SCOPE]
        )
        self._verify: str | bool = ca_file or True
        self._clock = clock
        self._lock = trio.Lock()
        # One refresh thread at a time: a refresh abandoned by a cancelled caller may
        # still be running; the lock guards the credentials object either way.
        self._thread_limiter = trio.CapacityLimiter(1)
        self._thread_lock = threading.Lock()
        self._token: str | None = None
        self._expires_at: datetime | None = None
        self.fetched = 0

    def __repr__(self) -> str:
        return f"GoogleAccessTokens(fetched={self.fetched})"

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
            token, lifetime = await trio.to_thread.run_sync(
                self._refresh_blocking, limiter=self._thread_limiter, abandon_on_cancel=True
            )
            self._token = token
            self._expires_at = self._clock.now() + lifetime
            self.fetched += 1
            return token

    def invalidate(self, token: str) -> None:
        if token == self._token:
            self._token = None
            self._expires_at = None

    def peek(self) -> str | None:
        return self._fresh()

    def _refresh_blocking(self) -> tuple[str, timedelta]:
        # A session per refresh: the next one is an hour away, so no connection is kept.
        with requests.Session() as session:
            session.trust_env = False
            session.verify = self._verify
            return self._refresh_with(GoogleRequest(session))

    def _refresh_with(self, inner: Any) -> tuple[str, timedelta]:
        def bounded(
            url: str, method: str = "GET", body: Any = None, headers: Any = None, **kw: Any
        ) -> Any:
            kw["timeout"] = REQUEST_BOUND
            return inner(url, method=method, body=body, headers=headers, **kw)

        with self._thread_lock:
            try:
                self._credentials.refresh(bounded)
            except google.auth.exceptions.RefreshError as exc:
                if getattr(exc, "retryable", False):
                    raise TokenUnavailable("the token endpoint failed") from None
                raise TokenRefused("the token endpoint refused the service account") from None
            except (google.auth.exceptions.TransportError, requests.RequestException, OSError):
                raise TokenUnavailable("the token endpoint could not be reached") from None
            token = self._credentials.token
            expiry = self._credentials.expiry
        if not isinstance(token, str) or not token:
            raise TokenUnavailable("the token endpoint gave no token")
        lifetime = timedelta(hours=1)
        if isinstance(expiry, datetime):
            # google-auth states expiry as naive UTC from its own reading of the wall clock.
            lifetime = expiry.replace(tzinfo=UTC) - datetime.now(UTC)
        return token, max(lifetime, timedelta(0))


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
    """The provider of one checked app: its own access tokens and connection."""
    return FcmProvider(
        project_id=setup.account.project_id,
        tokens=GoogleAccessTokens(setup.account, clock=clock, ca_file=setup.settings.ca_file),
        clock=clock,
        endpoint=setup.endpoint,
        ca_file=setup.settings.ca_file,
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
    ) -> None:
        self._url = f"{endpoint.rstrip('/')}/v1/projects/{project_id}/messages:send"
        self._project_id = project_id
        self.tokens = tokens
        self._clock = clock
        self._bound = request_bound
        ssl_context(ca_file, key="push.fcm.ca_file")  # a bad CA file fails here, naming the key
        self._client = Http2Client(ca_file=ca_file, name="fcm")
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

        Cancellation abandons the request (and a token fetch in its thread).
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
        """Close the connections (and stop the client's thread)."""
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
