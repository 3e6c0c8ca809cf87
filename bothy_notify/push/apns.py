"""The APNs provider: HTTP/2 to Apple with an ES256 provider token.

One long-lived HTTP/2 connection per APNs host, multiplexing every send
(:class:`~.http2.Http2Client`: libcurl in one thread); the host follows the
registration's ``environment`` (``production`` or ``sandbox``), so one daemon
serves TestFlight and App Store builds at once. ``push.apns.endpoint``
replaces both hosts (a proxy or a local fake).

Requests (SPEC section 10): ``POST /3/device/{token}`` with
``authorization: bearer <provider JWT>``, ``apns-topic`` = bundle id,
``apns-collapse-id`` = the thread's grouping value (:mod:`.grouping`: an HMAC of
the thread id, never the id), and either

- background style: ``apns-push-type: background``, ``apns-priority: 5``,
  ``{"aps": {"content-available": 1}, ...payload}``; or
- alert style: ``apns-push-type: alert``, ``apns-priority`` 5 for a ``low``
  urgency and 10 otherwise, ``{"aps": {"alert": {"title": <alert_title>,
  "title-loc-key"?: "BOTHY_<KIND>"}, "mutable-content": 1,
  "interruption-level": <level>, "sound": "default", "thread-id": <grouping
  value>}, ...payload}`` (iOS groups a conversation's notifications by
  ``thread-id``): the level
  ``passive``, ``active`` or ``time-sensitive`` for the urgency ``low``,
  ``normal`` or ``high`` (``[notify.urgency]``), no sound when the hint is
  quiet, the loc key only with ``title_loc_keys``.

An alert-style push's ``aps.badge`` is its ``badge`` (``push.badge``), so iOS
sets the icon's badge itself. A background push carries ``badge`` beside ``aps``
only: Apple allows nothing but ``content-available`` in a background push's
``aps``, so the app sets the badge when it wakes.

A Matrix notification (:class:`~.port.MatrixMessage`) goes as a hint does,
never collapsed and without sound; its badge-only update is background style.

Whatever ``style`` says, a clearing push (:class:`~.port.ReadMessage`) and a
deleted message's (:class:`~.port.RemovedMessage`) are background style,
priority 5, collapsed on their thread (they replace the thread's pending
notification), and a quiet period's summary
(:class:`~.port.SummaryMessage`) is alert style, ``passive``, priority 5,
without sound.

Answers become outcomes here and nowhere else:

=========================================================  ==========================
200                                                        delivered
410 Unregistered, ExpiredToken                             dead
400 BadDeviceToken, DeviceTokenNotForTopic, TopicDisallowed  mismatch (logged with the
                                                           environment and topic)
403 ExpiredProviderToken                                   a new JWT and one immediate
                                                           resend in the same deadline;
                                                           a second one: rejected
429, 5xx                                                   transient (1 s minimum)
no answer: timeout, connection, DNS, TLS, protocol error   transient (1 s minimum),
                                                           ``ours`` (never a strike)
every other status                                         rejected
=========================================================  ==========================

Rejections are logged with what to check by the token lifecycle
(:mod:`bothy_notify.notify.lifecycle`), once per reason per minute. A topic push
(:class:`~.port.TopicMessage`, topic mode) is always background, priority 5,
and collapses per topic, whatever ``style`` says.

Nothing here relies on the ``apns-id`` APNs echoes: each answer arrives on its
own HTTP/2 stream.

The whole send, resend included, is bounded by
:data:`~.transport.REQUEST_BOUND`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jwt
import orjson
import trio
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from bothy_notify.config import ApnsSettings, ApnsStyle, ConfigError, Secret
from bothy_notify.kernel.clock import Clock
from bothy_notify.push.http2 import Http2Client
from bothy_notify.push.port import (
    MatrixMessage,
    Message,
    Outcome,
    PushMessage,
    Refusal,
    Registrant,
    SummaryMessage,
    Target,
    TopicDelivery,
    TopicMessage,
    Unresolved,
)
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

log = logging.getLogger("bothy.push.apns")

PRODUCTION_HOST = "https://api.push.apple.com"
SANDBOX_HOST = "https://api.sandbox.push.apple.com"
TOKEN_REFRESH = timedelta(minutes=55)
"""A provider JWT is used for this long (Apple accepts 20 to 60 minutes)."""
RETRY_MINIMUM = timedelta(seconds=1)
"""Earliest retry after a transient APNs failure."""
INTERRUPTION_LEVELS = {"low": "passive", "normal": "active", "high": "time-sensitive"}
"""``aps.interruption-level`` of an alert-style push by the kind's urgency."""
COLLAPSE_ID_MAX = 64
"""APNs refuses an ``apns-collapse-id`` longer than 64 bytes (a grouping value has 32)."""

DEAD_REASONS = frozenset({"Unregistered", "ExpiredToken"})
MISMATCH_REASONS = frozenset({"BadDeviceToken", "DeviceTokenNotForTopic", "TopicDisallowed"})

_TEN_CHARS = re.compile(r"^[A-Za-z0-9]{10}$")
_BUNDLE_ID = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$")
DEVICE_TOKEN = re.compile(r"^[0-9a-fA-F]{64,200}$")
"""An APNs device token: hex of 32 bytes today (up to 100 leaves room). The one check,
used at registration (person and topic mode) and before every send."""
TOKEN_MAX = 200
ENVIRONMENTS = ("sandbox", "production")


@dataclass(frozen=True, slots=True)
class ApnsCredentials:
    """What signs provider tokens. The repr shows neither the key nor the ids."""

    key: ec.EllipticCurvePrivateKey
    key_id: str
    team_id: str

    def __repr__(self) -> str:
        return "ApnsCredentials(***)"


def load_credentials(config: ApnsSettings, key: str = "push.apns") -> ApnsCredentials:
    """Check and load ``<key>.key``, ``key_id``, ``team_id`` and ``bundle_id`` (``key`` is
    ``push.apns`` or ``push.apns.apps.<app_id>``).

    Raises :class:`ConfigError` naming the key that is missing or malformed,
    never showing its value; :class:`~.port.Unresolved` (after every other key is
    checked) when the key is a ``secret:`` reference not resolved yet.
    """
    if not _TEN_CHARS.fullmatch(config.key_id):
        raise ConfigError(f"{key}.key_id: expected the key's 10-character id")
    if not _TEN_CHARS.fullmatch(config.team_id):
        raise ConfigError(f"{key}.team_id: expected the 10-character team id")
    if len(config.bundle_id) > 155 or not _BUNDLE_ID.fullmatch(config.bundle_id):
        raise ConfigError(f"{key}.bundle_id: expected a bundle id like com.example.app")
    return ApnsCredentials(_signing_key(config.key, f"{key}.key"), config.key_id, config.team_id)


def _signing_key(secret: Secret | None, key: str) -> ec.EllipticCurvePrivateKey:
    if secret is None:
        raise ConfigError(f"{key}: required key is missing")
    if not secret.is_resolved:
        raise Unresolved(key)
    pem = secret.reveal().strip()
    if not pem:
        raise ConfigError(f"{key}: the secret is empty")
    if "\n" not in pem and "\\n" in pem:
        pem = pem.replace("\\n", "\n")  # a PEM pasted into one env line with escaped newlines
    try:
        loaded = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ConfigError(
            f"{key}: not a .p8 key (expected the PKCS#8 PEM of an EC P-256 private key)"
        ) from None
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(
        loaded.curve, ec.SECP256R1
    ):
        raise ConfigError(f"{key}: not an EC P-256 private key (APNs keys are ES256)")
    return loaded


@dataclass(frozen=True, slots=True)
class ApnsSetup:
    """One app's checked ``[push.apns]`` settings, ready to build a provider from."""

    settings: ApnsSettings
    credentials: ApnsCredentials
    hosts: Mapping[str, str] | None

    def __repr__(self) -> str:
        return "ApnsSetup(***)"


def prepare(settings: ApnsSettings, key: str) -> ApnsSetup:
    """Check one app's settings without connecting anywhere (``key`` names it in errors)."""
    hosts = None
    if settings.endpoint:
        base = check_https_url(settings.endpoint, key=f"{key}.endpoint")
        hosts = {"production": base, "sandbox": base}
    ssl_context(settings.ca_file, key=f"{key}.ca_file")
    return ApnsSetup(settings, load_credentials(settings, key), hosts)


def build(setup: ApnsSetup, clock: Clock) -> ApnsProvider:
    """The provider of one checked app."""
    return ApnsProvider(
        credentials=setup.credentials,
        topic=setup.settings.bundle_id,
        clock=clock,
        style=setup.settings.style,
        alert_title=setup.settings.alert_title,
        title_loc_keys=setup.settings.title_loc_keys,
        hosts=setup.hosts,
        ca_file=setup.settings.ca_file,
    )


def registrant(body: Mapping[str, Any]) -> Registrant | Refusal:
    """A registration's APNs device token (hex) and environment (default production)."""
    token = body.get("token")
    if not isinstance(token, str) or not DEVICE_TOKEN.fullmatch(token):
        return Refusal("token", "expected an APNs device token (hex)")
    return Registrant(token, environment=body.get("environment") or "production")


def pushkey_registrant(
    pushkey: str, _data: Mapping[str, Any] | None, environment: str | None
) -> Registrant | Refusal:
    """A Matrix pusher of an APNs app: the pushkey is the device token (hex), the
    environment the app's (``[matrix_gateway] apps``, default production)."""
    return registrant({"token": pushkey, "environment": environment})


def topic_delivery(body: Mapping[str, Any]) -> TopicDelivery | None:
    """Topic mode: ``token`` (hex) and an optional ``environment``; nothing else."""
    token, environment = body.get("token"), body.get("environment")
    if body.get("url") is not None or body.get("signing_key") is not None:
        return None
    if not isinstance(token, str) or not DEVICE_TOKEN.fullmatch(token):
        return None
    if environment is not None and environment not in ENVIRONMENTS:
        return None
    return TopicDelivery(token, environment or "production", None)


class ProviderTokens:
    """The ES256 provider JWT: minted on first use and again every 55 minutes.

    :meth:`invalidate` drops only the token a refused request used, so a newer
    token minted by a concurrent send survives.
    """

    def __init__(self, credentials: ApnsCredentials, clock: Clock) -> None:
        self._credentials = credentials
        self._clock = clock
        self._token: str | None = None
        self._issued: datetime | None = None
        self.minted = 0

    def current(self) -> str:
        """The token to use now (minting a new one when due)."""
        now = self._clock.now()
        if self._token is None or self._issued is None or now - self._issued >= TOKEN_REFRESH:
            self._token = jwt.encode(
                {"iss": self._credentials.team_id, "iat": int(now.timestamp())},
                self._credentials.key,
                algorithm="ES256",
                headers={"kid": self._credentials.key_id},
            )
            self._issued = now
            self.minted += 1
        return self._token

    def invalidate(self, token: str) -> None:
        """Forget ``token`` if it is still the current one."""
        if token == self._token:
            self._token = None
            self._issued = None

    def __repr__(self) -> str:
        return f"ProviderTokens(minted={self.minted})"


def apns_outcome(
    status: int | NoAnswer, reason: str = "", retry_after: timedelta | None = None
) -> Outcome:
    """The outcome of one APNs answer (status and its ``reason``), or of no answer
    (:class:`~.transport.NoAnswer`: transient with its reason); pure.

    A 403 ``ExpiredProviderToken`` is rejected here; :class:`ApnsProvider` resends
    once before it comes to that.
    """
    if isinstance(status, NoAnswer):
        # No answer from Apple: nothing is known about this token.
        return Outcome.transient(status.reason, RETRY_MINIMUM, ours=True)
    code = reason or f"http_{status}"
    if status == 200:
        return Outcome.delivered()
    if status == 410 and reason in DEAD_REASONS:
        return Outcome.dead(reason)
    if status == 400 and reason in MISMATCH_REASONS:
        return Outcome.mismatch(reason)
    if status == 429 or 500 <= status <= 599:
        return Outcome.transient(code, retry_delay(RETRY_MINIMUM, retry_after))
    return Outcome.rejected(code)


class ApnsProvider:
    """Sends to APNs; see the module docstring for requests and outcomes.

    Args:
        credentials: the signing key and its ids.
        topic: the bundle id (``apns-topic``).
        style: background or alert.
        alert_title: the generic title of alert-style pushes.
        title_loc_keys: alert style also carries ``title-loc-key`` = ``BOTHY_<KIND>``.
        hosts: base URL per registration environment.
        ca_file: CA bundle for the hosts (empty: the system's CAs).
        clock: the injected clock (provider token age, Retry-After dates).
        request_bound: seconds one send (resend included) may take.
    """

    name = "apns"
    bounds_every_send = True
    """Every request ends within its bound (libcurl's timer); see ``push/registry.py``."""

    def __init__(
        self,
        *,
        credentials: ApnsCredentials,
        topic: str,
        clock: Clock,
        style: ApnsStyle = ApnsStyle.BACKGROUND,
        alert_title: str = "New activity",
        title_loc_keys: bool = False,
        hosts: Mapping[str, str] | None = None,
        ca_file: str = "",
        request_bound: float = REQUEST_BOUND,
    ) -> None:
        self._topic = topic
        self._style = style
        self._alert_title = alert_title
        self._title_loc_keys = title_loc_keys
        self._clock = clock
        self._bound = request_bound
        self.tokens = ProviderTokens(credentials, clock)
        self._hosts = dict(hosts or {"production": PRODUCTION_HOST, "sandbox": SANDBOX_HOST})
        ssl_context(ca_file, key="push.apns.ca_file")  # a bad CA file fails here, naming the key
        # One client for both hosts: libcurl keeps exactly one HTTP/2 connection per host.
        self._client = Http2Client(ca_file=ca_file, name="apns")
        # The header lines each (push type, priority) shares, built once.
        self._fixed = {
            (push_type, priority): [
                f"apns-topic: {topic}",
                f"apns-push-type: {push_type}",
                f"apns-priority: {priority}",
                "content-type: application/json",
            ]
            for push_type in ("background", "alert")
            for priority in ("5", "10")
        }
        self._throttle = LogThrottle()

    @classmethod
    def from_config(
        cls, config: ApnsSettings, *, clock: Clock, key: str = "push.apns"
    ) -> ApnsProvider:
        """Build from ``[push.apns]`` (or one of its apps); raises :class:`ConfigError`
        naming a bad key."""
        return build(prepare(config, key), clock)

    def __repr__(self) -> str:
        return f"ApnsProvider(style={self._style.value!r})"

    def _alert(self, message: Message) -> bool:
        """Whether ``message`` goes alert style: a summary always, a hint or a Matrix
        event when the provider's style is alert, a clearing, topic or badge-only
        push never."""
        if isinstance(message, SummaryMessage):
            return True
        if isinstance(message, MatrixMessage):
            return message.event_id is not None and self._style is ApnsStyle.ALERT
        return isinstance(message, PushMessage) and self._style is ApnsStyle.ALERT

    def _type_and_priority(self, message: Message) -> tuple[str, str]:
        if not self._alert(message):
            return "background", "5"
        return "alert", "5" if getattr(message, "urgency", None) == "low" else "10"

    def headers(self, message: Message) -> dict[str, str]:
        """The APNs request headers of ``message`` (without authorization): its push
        type and priority (see the module docstring), and its collapse id (the
        thread's grouping value, or the topic of a topic push)."""
        push_type, priority = self._type_and_priority(message)
        out = {
            "apns-topic": self._topic,
            "apns-push-type": push_type,
            "apns-priority": priority,
            "content-type": "application/json",
        }
        if isinstance(message, TopicMessage):
            out["apns-collapse-id"] = message.collapse_id
        else:
            group = getattr(message, "group", None)
            if group is not None:
                out["apns-collapse-id"] = group
        return out

    def body(self, message: Message) -> bytes:
        """The APNs JSON body: ``aps`` beside the content-free payload."""
        aps: dict[str, Any]
        if not self._alert(message):
            aps = {"content-available": 1}
        else:
            alert: dict[str, str] = {"title": self._alert_title}
            if self._title_loc_keys and isinstance(message, PushMessage | SummaryMessage):
                alert["title-loc-key"] = "BOTHY_" + message.kind.upper()
            urgency = getattr(message, "urgency", None) or "normal"
            aps = {
                "alert": alert,
                "mutable-content": 1,
                "interruption-level": INTERRUPTION_LEVELS.get(urgency, "active"),
            }
            if isinstance(message, PushMessage) and not message.quiet:
                aps["sound"] = "default"
            badge = getattr(message, "badge", None)
            if badge is not None:
                aps["badge"] = badge  # iOS sets the app icon's badge (push.badge)
            group = getattr(message, "group", None)
            if group is not None:
                aps["thread-id"] = group  # iOS groups the conversation's notifications
        return orjson.dumps({"aps": aps, **message.payload()})

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send one push; never raises for an APNs or network problem.

        Cancellation abandons the request (the connection stays usable).
        """
        environment = target.environment or "production"
        base = self._hosts.get(environment)
        if base is None:
            return Outcome.rejected("unknown_environment")
        if not DEVICE_TOKEN.fullmatch(target.token):
            return Outcome.rejected("malformed_token")
        url = f"{base}/3/device/{target.token}"
        if isinstance(message, TopicMessage):
            headers = [f"{k}: {v}" for k, v in self.headers(message).items()]
        else:
            headers = self._fixed[self._type_and_priority(message)]
            group = getattr(message, "group", None)
            if group is not None:
                headers = [*headers, f"apns-collapse-id: {group}"]
        content = self.body(message)
        # The whole send, resend included, within one bound (libcurl keeps it per request).
        deadline = trio.current_time() + self._bound
        resent = False
        while True:
            left = deadline - trio.current_time()
            if left <= 0:
                return apns_outcome(NoAnswer("timeout"))
            token = self.tokens.current()
            answer = await self._client.request(
                url, [*headers, f"authorization: bearer {token}"], content, bound=left
            )
            if isinstance(answer, NoAnswer):
                return apns_outcome(answer)
            reason = _reason(answer)
            if answer.status == 403 and reason == "ExpiredProviderToken":
                self.tokens.invalidate(token)
                if not resent:
                    resent = True
                    continue
                # Logged with what to check by the token lifecycle (rejections).
                return Outcome.rejected(reason)
            if answer.status == 200:
                return apns_outcome(200)  # the common case: no reason, no Retry-After
            outcome = apns_outcome(
                answer.status,
                reason,
                parse_retry_after(answer.header("retry-after"), self._clock.now()),
            )
            self._explain(outcome, environment)
            return outcome

    def _explain(self, outcome: Outcome, environment: str) -> None:
        if outcome.kind.value == "mismatch" and self._throttle.allow(
            f"mismatch:{environment}:{outcome.reason}"
        ):
            log.warning(
                "APNs says the device token does not belong to this app: the registration"
                " is for environment %s and topic %s; check the shipped build's"
                " aps-environment and bundle id (not the device)",
                environment,
                self._topic,
                extra={"environment": environment, "topic": self._topic, "reason": outcome.reason},
            )

    async def aclose(self) -> None:
        """Close the connections (and stop the client's thread)."""
        await self._client.aclose()


def _reason(answer: ProviderAnswer) -> str:
    if answer.status == 200 or not answer.body:
        return ""
    try:
        parsed = json.loads(answer.body)
    except ValueError:
        return ""
    return safe_reason(parsed.get("reason") if isinstance(parsed, dict) else None, "")


# ---------------------------------------------------------------- what to check

HINTS: dict[str, str] = {
    "PayloadTooLarge": (
        "the push is larger than APNs accepts (4 KB): check the lengths of the IDs in"
        " hints (thread, message, target) and of push.apns.alert_title"
    ),
    "BadTopic": "check push.apns.bundle_id against the app's bundle id",
    "MissingTopic": "check push.apns.bundle_id",
    "BadPriority": "check push.apns.style (background pushes use priority 5)",
    "InvalidPushType": "check push.apns.style",
    "InvalidProviderToken": "check push.apns.key, push.apns.key_id and team_id",
    "MissingProviderToken": "check push.apns.key, push.apns.key_id and team_id",
    "ExpiredProviderToken": (
        "APNs refused two fresh provider tokens in a row: check push.apns.key_id,"
        " push.apns.team_id and this host's clock"
    ),
    "Forbidden": "check that the key in push.apns.key may send APNs pushes",
    "malformed_token": (
        "a stored APNs token is not a hex device token: the app registered something else"
    ),
    "unknown_environment": "a registration names an environment without an APNs host",
}
"""What to check, by the reason of a rejection (logged by the token lifecycle)."""
REJECTION_HINT = "APNs refused the message: look the reason up in Apple's table of APNs reasons"
"""Said for a rejection without a hint of its own."""
MISMATCH_HINT = (
    "check that the shipped build's aps-environment matches the registration's environment"
    " and that its bundle id is push.apns.bundle_id (the device is fine)"
)
"""What ``push test`` says about a mismatch."""
