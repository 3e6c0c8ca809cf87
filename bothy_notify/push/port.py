"""The provider port: what a send needs, what it returns.

Outcomes (SPEC section 10) and what the token lifecycle
(:mod:`bothy_notify.notify.lifecycle`) does with them:

- ``delivered``: ``last_seen_at`` set, strikes reset.
- ``dead``: the token is gone for good; the registration is invalidated (kept).
- ``mismatch``: the token belongs to another app or environment; kept, the error
  recorded, no strike (a build problem, not a device problem).
- ``rejected``: the provider refused this message; kept, the error recorded, no
  strike (a payload bug must never delete registrations); logged once per
  (provider, reason) per minute with what to check.
- ``transient``: try again later (``retry_after`` is the provider's minimum);
  the error is recorded. Only a *send* whose every attempt was transient may
  count one strike, and only when its last outcome is not ``ours``, no strike
  was counted within ``push.strike_interval``, and the same provider delivered
  to other registrations within that interval. ``push.max_strikes`` in a row
  invalidate.

``Outcome.ours`` says that no answer about this registration arrived: the
failure is on our side of the provider (or the provider as a whole), so it
says nothing about the token and never counts as a strike. Each provider sets
it where it builds the outcome:

=========  ===========================================  ===============================
provider   ``ours`` (never a strike)                    about the registration (may
                                                        strike while others deliver)
=========  ===========================================  ===============================
apns       connection, TLS, protocol errors, timeout    429, 5xx answers
           before an answer, the 30 s send bound
fcm        connection, TLS, protocol errors, timeout    429/quota, 5xx, ``UNAVAILABLE``,
           before an answer, the OAuth2 token endpoint  ``INTERNAL`` answers
           failing or timing out, the 30 s send bound
webhook    the egress proxy failing, the 30 s send      5xx answers, and DNS, connection,
           bound                                        TLS and timeouts of the
                                                        registration's own host
fake       never                                        ``transient-`` tokens
=========  ===========================================  ===============================
"""

from __future__ import annotations

import base64
import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from bothy_notify.kernel.values import fast_init


class OutcomeKind(enum.StrEnum):
    DELIVERED = "delivered"
    TRANSIENT = "transient"
    REJECTED = "rejected"
    MISMATCH = "mismatch"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of one send.

    Attributes:
        kind: what happened.
        retry_after: for ``transient``, the earliest sensible retry (``None``: the
            runner's backoff alone decides).
        reason: the provider's reason code (``BadDeviceToken``, ``UNREGISTERED``,
            ``http_503``, ``timeout``...); never a token, URL or ID.
        ours: for ``transient``, no answer about this registration arrived (our
            connection, DNS, TLS or token fetch failed, or time ran out before an
            answer): it never counts as a strike (see the module docstring).
    """

    kind: OutcomeKind
    retry_after: timedelta | None = None
    reason: str = ""
    ours: bool = False

    @classmethod
    def delivered(cls) -> Outcome:
        return cls(OutcomeKind.DELIVERED)

    @classmethod
    def transient(
        cls, reason: str, retry_after: timedelta | None = None, *, ours: bool = False
    ) -> Outcome:
        return cls(OutcomeKind.TRANSIENT, retry_after, reason, ours)

    @classmethod
    def rejected(cls, reason: str) -> Outcome:
        return cls(OutcomeKind.REJECTED, None, reason)

    @classmethod
    def mismatch(cls, reason: str) -> Outcome:
        return cls(OutcomeKind.MISMATCH, None, reason)

    @classmethod
    def dead(cls, reason: str) -> Outcome:
        return cls(OutcomeKind.DEAD, None, reason)


def _present(**members: Any) -> dict[str, Any]:
    """The members that are not ``None``, in order: a payload omits absent members
    (never null)."""
    return {key: value for key, value in members.items() if value is not None}


def _strings(payload: dict[str, Any]) -> dict[str, str]:
    """A payload with every value a string (FCM data messages)."""
    return {key: str(value) for key, value in payload.items()}


@fast_init
@dataclass(frozen=True, slots=True)
class PushMessage:
    """The content-free payload of a push: IDs, a kind, a count and a quiet flag.

    No message text, name or title ever goes in here.
    """

    nid: str
    kind: str
    count: int
    quiet: bool
    thread_id: str | None = None
    message_id: str | None = None
    target_id: str | None = None
    mv: str | None = None
    badge: int | None = None
    """Unread threads of the person when the push is sent (``push.badge``); ``None``: off."""
    urgency: str | None = None
    """``low``, ``normal`` or ``high`` (the kind's, ``[notify.urgency]``)."""
    group: str | None = None
    """The thread's grouping value (:mod:`.grouping`: an HMAC, never the id) that
    providers put where a phone groups a conversation; ``None``: no grouping."""

    def payload(self) -> dict[str, Any]:
        """The JSON payload: IDs as strings, absent members omitted (never null)."""
        out: dict[str, Any] = {"nid": self.nid, "kind": self.kind}
        for key in ("thread_id", "message_id", "target_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = str(value)
        out["count"] = self.count
        out["quiet"] = self.quiet
        if self.mv is not None:
            out["mv"] = self.mv
        if self.badge is not None:
            out["badge"] = self.badge
        if self.urgency is not None:
            out["urgency"] = self.urgency
        return out

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (FCM data messages)."""
        return {
            k: ("true" if v is True else "false" if v is False else str(v))
            for k, v in self.payload().items()
        }


@dataclass(frozen=True, slots=True)
class TopicMessage:
    """The payload of a topic-mode push (docs/topics.md): a topic and a sequence id.

    Content-free by construction: the envelope's data never comes here. Providers
    send it background-only (APNs priority 5 with ``apns-collapse-id`` = the
    base64 topic; FCM data-only without a collapse key); a webhook body adds
    ``recipient_id`` (hex) and nothing else.
    """

    topic: bytes
    sequence_id: int
    recipient_id: bytes

    def payload(self) -> dict[str, Any]:
        """``{"topic": base64, "sequence_id": "<decimal>"}`` (JavaScript never rounds it)."""
        return {
            "topic": base64.b64encode(self.topic).decode("ascii"),
            "sequence_id": str(self.sequence_id),
        }

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (it already is)."""
        return _strings(self.payload())

    @property
    def collapse_id(self) -> str:
        """APNs collapses a topic's pushes on the device: the base64 topic (at most 44)."""
        return str(self.payload()["topic"])

    @property
    def webhook_id(self) -> str:
        """The Standard Webhooks message id: one per (envelope, recipient), kept on retries."""
        return f"{self.sequence_id}.{self.recipient_id.hex()[:32]}"

    def webhook_body(self) -> dict[str, Any]:
        """The webhook body: the payload plus the recipient id in hex."""
        return {**self.payload(), "recipient_id": self.recipient_id.hex()}

    def __repr__(self) -> str:
        return f"TopicMessage(sequence_id={self.sequence_id})"


@dataclass(frozen=True, slots=True)
class ReadMessage:
    """A clearing push (``notify.push_clear``): the person read ``thread_id`` up to
    ``seq`` elsewhere, so the device drops that thread's notification and updates its
    badge. Content-free: ``{"kind": "read", "thread_id", "seq", "badge"}`` (and the
    kind's ``urgency``). Always background style (APNs ``content-available``,
    priority 5, collapsed on the thread; FCM data-only, priority NORMAL)."""

    thread_id: str
    seq: int
    badge: int | None = None
    urgency: str | None = None
    group: str | None = None
    """The thread's grouping value (as :attr:`PushMessage.group`)."""
    kind = "read"

    def payload(self) -> dict[str, Any]:
        return {
            "kind": "read",
            "thread_id": self.thread_id,
            "seq": self.seq,
            **_present(badge=self.badge, urgency=self.urgency),
        }

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (FCM data messages)."""
        return _strings(self.payload())

    @property
    def webhook_id(self) -> str:
        """The Standard Webhooks message id: one per (thread, position), kept on retries;
        a digest, never the thread id."""
        digest = hashlib.sha256(self.thread_id.encode()).hexdigest()[:24]
        return f"read.{digest}.{self.seq}"

    def __repr__(self) -> str:
        return f"ReadMessage(seq={self.seq})"


@dataclass(frozen=True, slots=True)
class RemovedMessage:
    """A deleted message's push (``notify.push_removed``): the device drops what it
    shows of ``message_id`` and updates its badge. Content-free: ``{"kind":
    "removed", "thread_id", "message_id", "badge"}`` (and the kind's ``urgency``).
    Background style like :class:`ReadMessage` (APNs ``content-available``, priority
    5, collapsed on the thread's grouping value; FCM data-only)."""

    thread_id: str
    message_id: str
    badge: int | None = None
    urgency: str | None = None
    group: str | None = None
    """The thread's grouping value (as :attr:`PushMessage.group`)."""
    kind = "removed"

    def payload(self) -> dict[str, Any]:
        return {
            "kind": "removed",
            "thread_id": self.thread_id,
            "message_id": self.message_id,
            **_present(badge=self.badge, urgency=self.urgency),
        }

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (FCM data messages)."""
        return _strings(self.payload())

    @property
    def webhook_id(self) -> str:
        """The Standard Webhooks message id: one per (thread, message), kept on
        retries; a digest, never an id."""
        digest = hashlib.sha256(f"{self.thread_id}\x00{self.message_id}".encode()).hexdigest()
        return f"removed.{digest[:32]}"

    def __repr__(self) -> str:
        return "RemovedMessage()"


@dataclass(frozen=True, slots=True)
class SummaryMessage:
    """The one push at the end of a quiet period (``notify.quiet_summary``):
    ``{"kind": "summary", "count", "badge"}``, ``count`` the threads with held hints
    still unread. APNs alert style: ``interruption-level`` passive, no sound."""

    nid: str
    """A UUIDv7 per quiet period's summary (the webhook's message id, kept on retries)."""
    count: int
    badge: int | None = None
    urgency: str | None = None
    kind = "summary"
    thread_id = None

    @property
    def webhook_id(self) -> str:
        return self.nid

    def payload(self) -> dict[str, Any]:
        return {
            "kind": "summary",
            "count": self.count,
            **_present(badge=self.badge, urgency=self.urgency),
        }

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (FCM data messages)."""
        return _strings(self.payload())


@dataclass(frozen=True, slots=True)
class MatrixMessage:
    """A Matrix homeserver's notification through the gateway (SPEC section 14c),
    content-free whatever the homeserver sent: ``{"event_id", "room_id", "unread",
    "missed_calls", "urgency"}`` (absent members omitted). The app fetches the event
    by its id, as Element does with ``event_id_only``. ``unread`` is also the badge
    (APNs alert style sets the icon's badge from it). A notification without an
    event is a badge update: the counts alone, background style. Never collapsed:
    each event is its own push. The repr shows no ID."""

    event_id: str | None
    room_id: str | None
    unread: int | None = None
    missed_calls: int | None = None
    urgency: str | None = None
    kind = "matrix"
    thread_id = None

    @property
    def badge(self) -> int | None:
        return self.unread

    @property
    def webhook_id(self) -> str:
        """A message id kept on retries: a digest of the event (or of the counts)."""
        key = self.event_id or f"badge.{self.unread}.{self.missed_calls}"
        return "matrix." + hashlib.sha256(key.encode()).hexdigest()[:32]

    def payload(self) -> dict[str, Any]:
        return _present(
            event_id=self.event_id,
            room_id=self.room_id,
            unread=self.unread,
            missed_calls=self.missed_calls,
            urgency=self.urgency,
        )

    def string_payload(self) -> dict[str, str]:
        """The payload with every value a string (FCM data messages)."""
        return _strings(self.payload())

    def __repr__(self) -> str:
        return f"MatrixMessage(badge_only={self.event_id is None})"


Message = PushMessage | TopicMessage | ReadMessage | RemovedMessage | SummaryMessage | MatrixMessage
"""What a provider sends: a hint (person mode), a topic push (topic mode), a clearing
push, a deleted message's push, a quiet period's summary, or a Matrix homeserver's
notification."""


@fast_init
@dataclass(frozen=True, slots=True)
class Target:
    """Where a push goes: one registration. The repr shows no token, key or ID.

    ``attempt`` and ``max_attempts`` are the send job's. ``last_error`` is the
    registration's latest error when it is newer than its latest delivery (else
    ``None``), as loaded before this attempt: the webhook provider reads it to
    tell "every attempt answered 404" apart. ``failure_count`` is the
    registration's strikes in a row.
    """

    registration_id: str
    user_id: str
    provider: str
    token: str
    platform: str
    environment: str | None = None
    app_id: str | None = None
    signing_key: str | None = None
    attempt: int = 1
    max_attempts: int = 1
    last_error: str | None = None
    failure_count: int = 0
    expires_at: datetime | None = None

    def __repr__(self) -> str:
        return f"Target(provider={self.provider!r}, platform={self.platform!r})"


class PushProvider(Protocol):
    """One push provider. ``name`` is the registration's ``provider`` value."""

    name: str

    async def send(self, target: Target, message: Message) -> Outcome:
        """Send ``message`` to ``target`` and translate the answer into one outcome.

        Never raises for a provider or network problem (that is ``transient``);
        every request is bounded by the provider (10 s). Cancellation abandons
        the request.
        """
        ...

    async def aclose(self) -> None:
        """Close connections."""
        ...


@runtime_checkable
class RegistrationChecker(Protocol):
    """A provider that vets a token at registration (the webhook's URL policy, a Web
    Push endpoint's hosts, a Matrix relay's gateway)."""

    async def check_registration(
        self, token: str, secret: str | None = None
    ) -> tuple[str, str] | None:
        """The bad field and a constant problem (never the token), or ``None`` when fine.
        ``secret`` is what the registration stores beside its token (a Matrix relay's
        gateway URL), for a provider whose check needs it."""
        ...


# ---------------------------------------------------------------- registering


@dataclass(frozen=True, slots=True)
class Registrant:
    """What a registration stores, as its provider reads it from the request: the
    token (a device token, a webhook URL, a Web Push endpoint), the APNs
    environment, the key material (never returned), and an expiry. The repr shows
    none of it."""

    token: str
    environment: str | None = None
    secret: str | None = None
    expires_at: datetime | None = None

    def __repr__(self) -> str:
        return "Registrant(***)"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A registration field that is wrong, and a constant problem (never its value)."""

    field: str
    problem: str


@dataclass(frozen=True, slots=True)
class TopicDelivery:
    """A topic-mode recipient's delivery as its channel reads it from the request:
    the token or URL, the environment, the signing key (raw bytes)."""

    token: str
    environment: str | None
    signing_key: bytes | None

    def __repr__(self) -> str:
        return "TopicDelivery(***)"


class Unresolved(Exception):
    """A ``secret:`` reference a provider needs is not resolved yet (``check-config``
    runs without the database); ``key`` names it."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key}: read from the secret store at run")
        self.key = key


PLAIN_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
"""A device token that is printable ASCII (FCM, the fake provider)."""


def plain_registrant(body: Mapping[str, Any]) -> Registrant | Refusal:
    """A registration's token of printable ASCII (its length is checked before)."""
    token = body.get("token")
    if not isinstance(token, str) or not PLAIN_TOKEN.fullmatch(token):
        return Refusal("token", "does not have the required form")
    return Registrant(token, environment=body.get("environment"))


def plain_topic_delivery(body: Mapping[str, Any]) -> TopicDelivery | None:
    """Topic mode: a ``token`` of printable ASCII and nothing else."""
    if any(body.get(name) is not None for name in ("url", "signing_key", "environment")):
        return None
    token = body.get("token")
    if not isinstance(token, str) or not PLAIN_TOKEN.fullmatch(token):
        return None
    return TopicDelivery(token, None, None)
