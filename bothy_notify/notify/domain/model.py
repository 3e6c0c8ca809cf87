"""Values of the decision: hints, facts, routes, skips, coalescing windows.

All are frozen dataclasses built at the edges (the round builds facts from the
store and the presence view) and passed inward. The round builds several per
recipient, so they take :func:`~bothy_notify.kernel.values.fast_init`'s cheaper
``__init__`` (same signature, still frozen).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.kernel.results import SkipReason
from bothy_notify.kernel.values import fast_init
from bothy_notify.vocabulary import Level

DESKTOP_PLATFORMS = frozenset({"macos", "windows"})
"""Platforms whose live, non-idle connection delays pushes to the person's phones."""


class Via(enum.StrEnum):
    """How a route reaches a device."""

    GATEWAY = "gateway"
    PUSH = "push"
    PUSH_DELAYED = "push_delayed"


class Kind(enum.StrEnum):
    """The built-in hint kinds; apps add namespaced kinds such as ``social:friend_request``."""

    MESSAGE = "message"
    MENTION = "mention"
    SECURITY = "security"
    ADMIN = "admin"


BUILTIN_KIND_CATEGORY = {
    Kind.MESSAGE: "messages",
    Kind.MENTION: "mentions",
    Kind.SECURITY: "security",
    Kind.ADMIN: "admin",
}


@fast_init
@dataclass(frozen=True, slots=True)
class Hint:
    """Something a person may hear about, before it is decided per recipient.

    Attributes:
        nid: the notification ID (UUIDv7), shared by every route of this hint.
        kind: ``message``, ``mention``, ``security``, ``admin`` or an app kind.
        category: the preference category the kind belongs to.
        thread_id: the thread it is about, if any.
        message_id: the message it points at, if any.
        target_id: the target of a hint without a thread (device, grant, ...).
        message_seq: the thread sequence of the message; 0 without a message.
        actor_id: who caused it; never a recipient.
        mentions: people mentioned by the message.
        quiet: the device should update without sound or banner.
        count: a fixed count (a flush hint); ``None`` means the unread count.
        is_flush: the end-of-window hint of coalescing; it never folds or opens a window.
        mv: the kind catalogue's version, fixed when the hint is decided; every copy
            (gateway, push, delayed push) carries this one value. ``None``: not sent.
        mention_only: the hint exists only because it mentions its recipients (an
            edit's newly mentioned people): a recipient who does not hear mentions
            hears nothing, never the message instead.
    """

    nid: str
    kind: str
    category: str
    thread_id: str | None = None
    message_id: str | None = None
    target_id: str | None = None
    message_seq: int = 0
    actor_id: str | None = None
    mentions: frozenset[str] = frozenset()
    quiet: bool = False
    count: int | None = None
    is_flush: bool = False
    mv: str | None = None
    mention_only: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class Device:
    """An active device of the recipient and its active push registrations."""

    device_id: str
    platform: str
    registrations: tuple[str, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class RecipientFacts:
    """Everything the decision knows about one recipient of one hint.

    Attributes:
        user_id: the recipient.
        human: the account is a human (agents and apps get nothing).
        active: the account is active.
        has_access: read access to the hint's thread (``True`` without a thread).
        level: the follow level for the hint's thread.
        categories_off: categories the person switched off.
        read_position: ``max(last_read_seq, unread_floor_seq)`` for the thread.
        devices: active devices with their active registrations.
        presence: the person's live connections (see the presence port).
        quiet: the person is in quiet hours now (snoozed, or a schedule entry
            covers their wall-clock time): gateway hints carry ``quiet: true``.
    """

    user_id: str
    human: bool
    active: bool
    has_access: bool
    level: Level
    categories_off: frozenset[str]
    read_position: int
    devices: tuple[Device, ...]
    presence: tuple[PresenceEntry, ...]
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    """The configuration the decision reads.

    Attributes:
        mobile_delay: ``notify.mobile_delay_when_desktop_active``.
        coalesce_window: ``notify.coalesce_window``; zero turns coalescing off.
    """

    mobile_delay: timedelta
    coalesce_window: timedelta


@fast_init
@dataclass(frozen=True, slots=True)
class Route:
    """One device's way to hear about a hint.

    ``registrations`` lists the push registrations of a push route (empty for
    the gateway); ``delay`` is zero except for ``push_delayed``.
    """

    via: Via
    device_id: str
    registrations: tuple[str, ...] = ()
    delay: timedelta = timedelta(0)


@fast_init
@dataclass(frozen=True, slots=True)
class Window:
    """An open coalescing window of one (recipient, thread).

    ``count`` is the number of messages the window saw (the first included);
    ``first_seq`` the message of the hint that opened it; ``newest_seq`` and
    ``newest_message_id`` the newest message folded in; ``mention`` whether a
    folded message mentioned the recipient.
    """

    opened_at: datetime
    closes_at: datetime
    count: int
    first_seq: int
    newest_seq: int
    newest_message_id: str
    mention: bool = False

    def is_open(self, now: datetime) -> bool:
        return now < self.closes_at


@fast_init
@dataclass(frozen=True, slots=True)
class Skip:
    """No hint for this recipient, and why."""

    user_id: str
    reason: SkipReason


@fast_init
@dataclass(frozen=True, slots=True)
class Fold:
    """The message was folded into the recipient's open window (no hint now)."""

    user_id: str
    window: Window


@fast_init
@dataclass(frozen=True, slots=True)
class Delivery:
    """The recipient hears about the hint through ``routes``.

    ``opens`` is the coalescing window this hint opens, when coalescing applies.
    ``hushed``: the recipient is in quiet hours, so the gateway hint carries
    ``quiet: true`` whatever ``quiet`` says (pushes keep ``quiet``: one that
    breaks through quiet hours must still sound; the rest are held at send).
    """

    user_id: str
    kind: str
    category: str
    count: int
    quiet: bool
    routes: tuple[Route, ...]
    opens: Window | None = None
    hushed: bool = False


Decision = Skip | Fold | Delivery
