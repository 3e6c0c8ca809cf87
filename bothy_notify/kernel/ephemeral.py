"""The ephemeral publisher port: hand an event to a person's live connections.

Ephemeral events (``notification.created``) are pure acceleration: never stored,
delivered at most once, never before a connection's ``catchup.complete``,
dropped (and counted) when a connection's outbound queue is full.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class EphemeralEvent:
    """A server event for the gateway (SPEC section 8, point 5).

    Attributes:
        type: the event type, e.g. ``notification.created``.
        id: the envelope ID (UUIDv7).
        occurred_at: when the event was made.
        audience: the person the event is for.
        resource_kind: ``thread`` or ``user``; admission depends on it.
        resource_id: the thread ID, or the audience's user ID.
        scope: the thread's current place (space, channel, thread); empty for ``user``;
            ``None``: the frame has no ``scope`` member (``read.updated``).
        payload: the content-free payload (IDs, kind, count, quiet).
        appended_at: when the event that caused it was appended, for the
            delivery-latency metric; never sent.
        not_device: see below.
    """

    type: str
    id: str
    occurred_at: datetime
    audience: str
    resource_kind: str
    resource_id: str
    scope: dict[str, str] | None = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    appended_at: datetime | None = None
    not_device: str | None = None
    """A device whose connection does not get the event (the one that caused it);
    never sent."""

    def to_frame(self) -> dict[str, Any]:
        """The JSON object sent on the wire; absent members are omitted, never null."""
        frame: dict[str, Any] = {
            "type": self.type,
            "id": self.id,
            "occurred_at": self.occurred_at.isoformat().replace("+00:00", "Z"),
            "audience": self.audience,
            "resource": {"kind": self.resource_kind, "id": self.resource_id},
        }
        if self.scope is not None:
            frame["scope"] = dict(self.scope)
        frame["payload"] = {k: v for k, v in self.payload.items() if v is not None}
        return frame


class EphemeralPublisher(Protocol):
    """Publish an ephemeral event to the live, admitted connections of its audience."""

    async def publish(self, event: EphemeralEvent, *, access_checked: bool = False) -> int:
        """Queue ``event`` for every admitted live connection of ``event.audience``.

        Returns the number of connections it was queued to (0 is not an error).
        Never waits on a connection: a full queue drops the frame and counts it.

        ``access_checked``: the caller has just read, in one statement with no
        database call since, that the audience may read the event's thread now
        (the publisher then skips its own read of it). Every other rule of
        admission still applies.
        """
        ...


class RecordingPublisher:
    """An in-memory publisher for tests: keeps every event it was given."""

    def __init__(self) -> None:
        self.events: list[EphemeralEvent] = []

    async def publish(self, event: EphemeralEvent, *, access_checked: bool = False) -> int:
        self.events.append(event)
        return 1

    def __repr__(self) -> str:
        return f"RecordingPublisher(events={len(self.events)})"
