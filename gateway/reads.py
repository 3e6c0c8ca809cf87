"""The ``read.updated`` frame: a read position moved forward, told to the person's
other live connections so desktops can dismiss their notifications too.

:func:`bothy_notify.store.projections.mark_read` (every way a position is written)
runs ``pg_notify('bothy_read_updated', '{"user_id","thread_id","seq","device_id"?}')``
in its transaction, so the notification arrives after the commit: once the
position is stored. Every gateway listens on a dedicated connection; for a batch
of notifications whose people have live connections here it reads their badges
(``push.badge``) in one statement, then publishes each frame through the hub's
publisher, admitted like ``notification.created`` (SPEC section 8, point 5: live,
human, the audience's own connections, read access to the thread now), never to
the reading device (whose ``read`` op or ``PUT`` caused it; the ``thread.read``
event names no device, so every connection hears it).

A notification sent while nobody listened is lost: the frame is acceleration only;
a client reconnecting asks the ``unread`` op.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta

import trio

from bothy_notify.config import BadgeMode
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.ephemeral import EphemeralEvent, EphemeralPublisher
from bothy_notify.kernel.ids import new_id
from bothy_notify.store.db import Database
from bothy_notify.store.listen import Listener, Listening, Notification, reconnect_backoff
from bothy_notify.store.projections import READ_UPDATED_CHANNEL
from bothy_notify.store.unread import badges_of
from gateway.hub import Hub

log = logging.getLogger("bothy.gateway.reads")

READ_UPDATED = "read.updated"


@dataclass(frozen=True, slots=True)
class ReadUpdate:
    """One notification: the person, the thread, the stored position, the reading
    device (``None``: unknown)."""

    user_id: str
    thread_id: str
    seq: int
    device_id: str | None

    def __repr__(self) -> str:
        return f"ReadUpdate(seq={self.seq})"


def read_update(payload: str) -> ReadUpdate | None:
    """The update a notification carries; ``None`` (logged) when it is not the JSON
    object ``{"user_id","thread_id","seq","device_id"?}`` (never trusted blindly)."""
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        user, thread, seq = parsed.get("user_id"), parsed.get("thread_id"), parsed.get("seq")
        device = parsed.get("device_id")
        if (
            isinstance(user, str)
            and isinstance(thread, str)
            and type(seq) is int
            and (device is None or isinstance(device, str))
        ):
            return ReadUpdate(user, thread, seq, device)
    log.warning("a read notification without a person, thread and position was ignored")
    return None


class ReadListener:
    """Listens for read positions moved forward and publishes ``read.updated``.

    Args:
        database_url: for the dedicated ``LISTEN`` connection (never logged).
        hub: whose people have live connections here.
        db: for the badges.
        publisher: the hub's publisher (admission, queues).
        clock: stamps ``occurred_at``.
        badge: ``push.badge``; ``off`` leaves ``badge`` out.
        retry_interval: the first wait before reconnecting (``notify.poll_interval``).
    """

    def __init__(
        self,
        *,
        database_url: str,
        hub: Hub,
        db: Database,
        publisher: EphemeralPublisher,
        clock: Clock,
        badge: BadgeMode,
        retry_interval: timedelta,
    ) -> None:
        self._hub = hub
        self._db = db
        self._publisher = publisher
        self._clock = clock
        self._badge = badge
        self.listener = Listener(
            database_url,
            [READ_UPDATED_CHANNEL],
            name="reads",
            reconnect=reconnect_backoff(retry_interval.total_seconds()),
            timeouts=db.timeouts,
        )

    def __repr__(self) -> str:
        return "ReadListener()"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting after a lost connection;
        ``task_status.started()`` once ``LISTEN`` is in effect."""
        await self.listener.run(self._serve, task_status=task_status)

    async def _serve(self, listening: Listening) -> None:
        await listening.listen()
        while True:
            await self.publish(await listening.wait())

    async def publish(self, notifications: list[Notification]) -> None:
        """Publish the frame of each update whose person has a live connection here."""
        updates = [
            u
            for note in notifications
            if (u := read_update(note.payload)) is not None
            and self._hub.live_connections(u.user_id)
        ]
        if not updates:
            return
        badges: dict[str, int] = {}
        if self._badge is BadgeMode.UNREAD_THREADS:
            people = {u.user_id for u in updates}
            badges = await self._db.run(lambda c: badges_of(c, people), transaction=False)
        now = self._clock.now()
        for u in updates:
            payload: dict[str, object] = {"thread_id": u.thread_id, "seq": u.seq}
            if self._badge is BadgeMode.UNREAD_THREADS:
                payload["badge"] = badges.get(u.user_id, 0)
            await self._publisher.publish(
                EphemeralEvent(
                    type=READ_UPDATED,
                    id=new_id(),
                    occurred_at=now,
                    audience=u.user_id,
                    resource_kind="thread",
                    resource_id=u.thread_id,
                    scope=None,
                    payload=payload,
                    not_device=u.device_id,
                )
            )
