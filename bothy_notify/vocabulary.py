"""The product's words that both the configuration and the pure decision use.

How much of a thread a person hears about (:class:`Level`), how urgently a push
should arrive (:class:`Urgency`), what a badge counts (:class:`BadgeMode`), and
the categories of the built-in hint kinds. They are values, not settings: the
configuration's keys take them as their types (``notify.default_level``,
``[notify.urgency]``, ``push.badge``), and ``notify/domain`` decides with them
without importing the configuration. It is the bottom layer of
``.importlinter``: it imports nothing of the project.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Level(enum.StrEnum):
    """How much of a thread a person hears about."""

    ALL = "all"
    MENTIONS = "mentions"
    NONE = "none"


class Urgency(enum.StrEnum):
    """How urgently a kind's push should reach the person (``[notify.urgency]``)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


class BadgeMode(enum.StrEnum):
    """What a push's ``badge`` counts (``push.badge``)."""

    UNREAD_THREADS = "unread_threads"
    OFF = "off"


DEFAULT_URGENCY: Mapping[str, Urgency] = {
    "security": Urgency.HIGH,
    "mention": Urgency.HIGH,
    "read": Urgency.LOW,
    "removed": Urgency.LOW,
    "summary": Urgency.LOW,
}
"""The urgency of a kind that ``[notify.urgency]`` does not name; any other kind is
``normal``."""

BUILTIN_CATEGORIES = ("messages", "mentions", "security", "admin")
"""Categories of the built-in hint kinds; app categories come from ``notify.categories``."""

CATEGORY_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
"""The form of an app category of ``notify.categories``: a lowercase name."""
