"""Values of the reference client, and the port through which it learns the app's
conversations and keys."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


class ConversationKind(enum.StrEnum):
    GROUP = "group"
    DM = "dm"
    SYNC = "sync"
    """The installation's own sync group: only ``include_sync_groups`` decides it."""


class Consent(enum.StrEnum):
    ALLOWED = "allowed"
    DENIED = "denied"
    UNKNOWN = "unknown"


class Override(enum.StrEnum):
    """A per-conversation choice that beats the rules (``NONE``: the rules decide)."""

    ENABLED = "enabled"
    DISABLED = "disabled"
    NONE = "none"


class Status(enum.StrEnum):
    DISABLED = "disabled"
    ENABLED = "enabled"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Conversation:
    """What the client needs to know of one conversation.

    Attributes:
        topic: its topic bytes (kind 0x00 and a 16-byte id).
        kind: group, dm, or the installation's sync group.
        consent: the user's consent state for it.
        active: whether this installation is still an active member.
    """

    topic: bytes
    kind: ConversationKind = ConversationKind.GROUP
    consent: Consent = Consent.ALLOWED
    active: bool = True

    def __repr__(self) -> str:
        return f"Conversation(kind={self.kind.value!r}, consent={self.consent.value!r})"


class ConversationSource(Protocol):
    """The app's side: its conversations, its welcome topic, its HMAC keys.

    Reads only; called from the client's sync run, never inside an app transaction.
    """

    def conversations(self) -> Iterable[Conversation]:
        """Every conversation the installation knows (active or not)."""
        ...

    def welcome_topic(self) -> bytes:
        """The installation's welcome topic (kind 0x01 and its 32-byte id)."""
        ...

    def hmac_key(self, topic: bytes, epoch: int) -> bytes | None:
        """The 42-byte HMAC key this inbox signs ``topic``'s messages with in ``epoch``
        (``None`` when it has none)."""
        ...

    def root_key_fingerprint(self) -> str:
        """Identifies the root key the HMAC keys derive from; a change re-uploads keys."""
        ...


@dataclass
class MemoryConversations:
    """An in-memory :class:`ConversationSource` (tests, examples, small bots).

    Keys are ``keys[(topic, epoch)]``; :attr:`root` is the fingerprint.
    """

    welcome: bytes
    items: dict[bytes, Conversation] = field(default_factory=dict)
    keys: dict[tuple[bytes, int], bytes] = field(default_factory=dict)
    root: str = "root-1"

    def add(self, conversation: Conversation) -> None:
        self.items[conversation.topic] = conversation

    def conversations(self) -> Iterable[Conversation]:
        return list(self.items.values())

    def welcome_topic(self) -> bytes:
        return self.welcome

    def hmac_key(self, topic: bytes, epoch: int) -> bytes | None:
        return self.keys.get((topic, epoch))

    def root_key_fingerprint(self) -> str:
        return self.root

    def __repr__(self) -> str:
        return f"MemoryConversations(conversations={len(self.items)})"


@dataclass(frozen=True, slots=True)
class Delivery:
    """How the daemon reaches this client: ``channel`` with a token, or a webhook URL
    and its signing key. The repr shows the channel only."""

    channel: str
    token: str | None = None
    environment: str | None = None
    url: str | None = None
    signing_key: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "token": self.token,
            "environment": self.environment,
            "url": self.url,
            "signing_key": None if self.signing_key is None else self.signing_key.hex(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Delivery:
        key = data.get("signing_key")
        return cls(
            data["channel"],
            data.get("token"),
            data.get("environment"),
            data.get("url"),
            None if key is None else bytes.fromhex(key),
        )

    def __repr__(self) -> str:
        return f"Delivery(channel={self.channel!r})"


@dataclass(frozen=True, slots=True)
class Rules:
    """Which conversations are subscribed when no override says otherwise."""

    consent_states: frozenset[Consent] = frozenset({Consent.ALLOWED})
    include_welcomes: bool = True
    include_sync_groups: bool = False
    include_commits: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "consent_states": sorted(c.value for c in self.consent_states),
            "include_welcomes": self.include_welcomes,
            "include_sync_groups": self.include_sync_groups,
            "include_commits": self.include_commits,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rules:
        return cls(
            frozenset(Consent(c) for c in data["consent_states"]),
            bool(data["include_welcomes"]),
            bool(data["include_sync_groups"]),
            bool(data["include_commits"]),
        )


@dataclass(frozen=True, slots=True)
class RecipientState:
    """The daemon's view of the recipient, as every mutating answer reports it."""

    topic_count: int
    channel: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class NotificationState:
    """The client's local state (no call to the daemon behind it).

    ``error_code`` and ``error_message`` are set when ``status`` is failed;
    ``recipient`` is the last answer seen while enabled.
    """

    status: Status
    error_code: str | None = None
    error_message: str | None = None
    recipient: RecipientState | None = None
