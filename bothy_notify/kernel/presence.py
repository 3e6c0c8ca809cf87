"""The presence port: who is connected right now, with focus and idle.

Presence is an internal fact of the hint decision. It is never sent to anyone,
never logged and never put in a metric. Implementations copy under their own
lock and never wait on a connection, so :meth:`PresenceView.entries` may be
called from the consumer round's worker thread.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PresenceEntry:
    """One live device connection of a person, as the decision sees it.

    Attributes:
        device_id: the device holding the connection.
        platform: the device's platform (``macos``, ``windows``, ``ios``, ...).
        focus: the threads the device reported in focus (readable ones only).
        idle: whether the device reported itself idle; ``False`` until it says so.
    """

    device_id: str
    platform: str
    focus: frozenset[str]
    idle: bool


class PresenceView(Protocol):
    """Read the presence of people: one entry per device with a live connection."""

    def entries(self, user_ids: Collection[str]) -> Mapping[str, tuple[PresenceEntry, ...]]:
        """Return, for each person in ``user_ids`` with a counted connection, their entries.

        People without one are absent from the result (not an empty tuple).
        Never blocks on a connection; safe to call from a worker thread.
        """
        ...


class NoPresence:
    """Nobody is connected: the presence of role ``worker`` and ``api`` wiring."""

    def entries(self, user_ids: Collection[str]) -> Mapping[str, tuple[PresenceEntry, ...]]:
        return {}

    def __repr__(self) -> str:
        return "NoPresence()"


class StaticPresence:
    """An in-memory presence for tests: set entries per person by hand."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[PresenceEntry, ...]] = {}

    def set(self, user_id: str, *entries: PresenceEntry) -> None:
        """Replace the entries of ``user_id`` (no entries: the person is absent)."""
        if entries:
            self._entries[user_id] = tuple(entries)
        else:
            self._entries.pop(user_id, None)

    def entries(self, user_ids: Collection[str]) -> Mapping[str, tuple[PresenceEntry, ...]]:
        return {u: self._entries[u] for u in user_ids if u in self._entries}

    def __repr__(self) -> str:
        return f"StaticPresence(people={len(self._entries)})"
