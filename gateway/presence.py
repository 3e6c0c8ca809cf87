"""The presence view over the hub: the kernel's ``PresenceView`` port (SPEC section 6).

A connection counts exactly when its principal is a human (token ``kind`` =
``user``), it has identified a device, it is in phase ``live`` (its
``catchup.complete`` is written) and it is not closing. Its entry holds a copy
of its focus (the readable threads it reported) and its idle flag; a
connection that never sent focus has an empty focus and is not idle. There is
at most one entry per device (the newer connection wins while a replacement
is under way), and a person without a counted connection is absent.

The read copies under the hub's lock, never waits on a connection and reads
no database, so the consumer round calls it from its worker thread. Presence
is an internal fact of the decision: it is never sent to anyone, logged, or
put in a metric.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from bothy_notify.kernel.presence import PresenceEntry
from gateway.hub import Hub


class HubPresence:
    """:class:`bothy_notify.kernel.presence.PresenceView` over a :class:`Hub`."""

    def __init__(self, hub: Hub) -> None:
        self._hub = hub

    def __repr__(self) -> str:
        return "HubPresence()"

    def entries(self, user_ids: Collection[str]) -> Mapping[str, tuple[PresenceEntry, ...]]:
        """One entry per counted device connection of each person in ``user_ids``.

        Safe from any thread; returns at once whatever the connections are doing.
        """
        return self._hub.presence(user_ids)
