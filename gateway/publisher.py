"""The ephemeral publisher over the hub: the kernel's ``EphemeralPublisher`` port.

Admission (SPEC section 8, point 5), checked for every frame:

- only live connections of the event's audience, whose principal is a human;
- ``resource.kind = thread``: the audience may read the thread at this moment
  (one database check per publish, so a revocation applied after the job's
  own check still stops the frame), unless the caller says it has just read
  exactly that in its own check, with no database call since
  (``access_checked``: a gateway hint's job check, right after the round's
  commit or right after the claim, read access for the whole batch);
- ``resource.kind = user``: only when the resource is the audience itself (a
  hint without a thread reaches that person alone);
- a hint is never sent to the device it is about (``payload.target_id``), so
  a device waiting for approval is not told about itself;
- an event is never sent to the device that caused it (``not_device``: the
  reader of a ``read.updated``).

Frames are offered to each connection's bounded queue without waiting: a full
queue drops the frame for that connection and counts it
(``bothy_gateway_dropped_total{reason="queue_full"}``); it is never a reason
to close. Refused frames count as ``reason="not_admitted"``.
"""

from __future__ import annotations

from functools import partial

from bothy_notify.kernel.ephemeral import EphemeralEvent
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.store.db import Database
from gateway import queries
from gateway.connection import Connection
from gateway.hub import DROP_NOT_ADMITTED, DROP_QUEUE_FULL, Hub
from gateway.protocol import encode

RESOURCE_THREAD = "thread"
"""``resource.kind`` of a hint about a thread: needs read access at publish."""
RESOURCE_USER = "user"
"""``resource.kind`` of a hint without a thread: only to that person."""


def admits(event: EphemeralEvent, conn: Connection) -> bool:
    """The rules of admission that need no database (the thread check is separate)."""
    if not conn.human or conn.user_id != event.audience:
        return False
    if event.payload.get("target_id") == conn.device_id:
        return False
    if event.not_device is not None and event.not_device == conn.device_id:
        return False
    if event.resource_kind == RESOURCE_USER:
        return event.resource_id == event.audience
    return event.resource_kind == RESOURCE_THREAD


class HubPublisher:
    """:class:`bothy_notify.kernel.ephemeral.EphemeralPublisher` over a :class:`Hub`.

    Args:
        hub: the connections.
        db: for the read-access check of thread events.
        instrument: told of every event whose frame is about to be queued.
    """

    def __init__(self, *, hub: Hub, db: Database, instrument: Instrument | None = None) -> None:
        self._hub = hub
        self._db = db
        self._instrument = instrument

    def __repr__(self) -> str:
        return "HubPublisher()"

    async def publish(self, event: EphemeralEvent, *, access_checked: bool = False) -> int:
        """Queue ``event`` for every admitted live connection of its audience.

        Returns how many connections it was queued to. Never waits on a
        connection. Cancellation during the access check queues nothing. With
        ``access_checked`` the caller's own read of the audience's access to the
        thread stands for the check (no query, no wait).
        """
        if not self._hub.live_connections(event.audience):
            return 0
        if event.resource_kind == RESOURCE_THREAD and not access_checked:
            readable = await self._db.run(
                partial(queries.may_read, user_id=event.audience, thread_id=event.resource_id),
                transaction=False,  # one statement
            )
            if not readable:
                self._hub.count_dropped(DROP_NOT_ADMITTED)
                return 0
        text = encode(event.to_frame())
        appended = event.appended_at.timestamp() if event.appended_at is not None else None
        if self._instrument is not None:  # before the offers: one may write at once
            self._instrument.frame_published(event.payload)
        queued = 0
        for conn in self._hub.live_connections(event.audience):
            if not admits(event, conn):
                self._hub.count_dropped(DROP_NOT_ADMITTED)
            elif conn.offer(text, appended):
                queued += 1
            else:
                self._hub.count_dropped(DROP_QUEUE_FULL)
        return queued
