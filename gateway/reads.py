"""The ``read.updated`` and ``notification.removed`` frames, which let desktops
dismiss their notifications too. ``read.updated``: a read position moved forward,
told to the person's other live connections.

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

The same listener (one connection, two channels) serves ``notification.removed``:
the round runs ``pg_notify('bothy_message_removed', '{"thread_id","message_id",
"space_id"?,"channel_id"?,"user_ids":[...]}')`` when it applies ``message.deleted``
(:func:`bothy_notify.store.deletions.tell_removed`: the message's candidates with a
live connection, several notifications for a long list), and each gateway publishes
``{"type":"notification.removed",...,"scope":{...},"payload":{"thread_id",
"message_id","badge"}}`` to those of them with live connections here, with the
badge of that moment (after the commit: ``last_seq`` already moved the thread's
last message back), admitted like ``notification.created``.

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
from bothy_notify.store.deletions import MESSAGE_REMOVED_CHANNEL
from bothy_notify.store.listen import Listener, Listening, Notification, reconnect_backoff
from bothy_notify.store.projections import READ_UPDATED_CHANNEL
from bothy_notify.store.unread import badges_of
from gateway.hub import Hub

log = logging.getLogger("bothy.gateway.reads")

READ_UPDATED = "read.updated"
NOTIFICATION_REMOVED = "notification.removed"


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


@dataclass(frozen=True, slots=True)
class Removal:
    """One notification of a deleted message: the thread and its place, the message,
    and the people whose live connections are told."""

    thread_id: str
    message_id: str
    space_id: str | None
    channel_id: str | None
    user_ids: tuple[str, ...]

    def __repr__(self) -> str:
        return f"Removal(people={len(self.user_ids)})"


def _optional_id(value: object) -> bool:
    return value is None or isinstance(value, str)


def removal(payload: str) -> Removal | None:
    """The removal a notification carries; ``None`` (logged) when it is not the JSON
    object :func:`~bothy_notify.store.deletions.tell_removed` sends."""
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        thread, message = parsed.get("thread_id"), parsed.get("message_id")
        space, channel, users = (
            parsed.get("space_id"),
            parsed.get("channel_id"),
            parsed.get("user_ids"),
        )
        if (
            isinstance(thread, str)
            and isinstance(message, str)
            and _optional_id(space)
            and _optional_id(channel)
            and isinstance(users, list)
            and all(isinstance(u, str) for u in users)
        ):
            return Removal(thread, message, space, channel, tuple(users))
    log.warning("a removal notification without a thread, message and people was ignored")
    return None


class ReadListener:
    """Listens for read positions moved forward and publishes ``read.updated``, and
    for deleted messages and publishes ``notification.removed``.

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
            [READ_UPDATED_CHANNEL, MESSAGE_REMOVED_CHANNEL],
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
        """Publish the frame of each update or removal whose person has a live
        connection here (the badges of all of them read in one statement)."""
        live = self._hub.live_connections
        updates: list[ReadUpdate] = []
        removals: list[tuple[Removal, list[str]]] = []
        for note in notifications:
            if note.channel == MESSAGE_REMOVED_CHANNEL:
                found = removal(note.payload)
                if found is not None:
                    here = [u for u in dict.fromkeys(found.user_ids) if live(u)]
                    if here:
                        removals.append((found, here))
            elif (u := read_update(note.payload)) is not None and live(u.user_id):
                updates.append(u)
        if not updates and not removals:
            return
        badges: dict[str, int] = {}
        if self._badge is BadgeMode.UNREAD_THREADS:
            people = {u.user_id for u in updates}
            people.update(user for _r, users in removals for user in users)
            badges = await self._db.run(lambda c: badges_of(c, people), transaction=False)
        now = self._clock.now()
        for found, users in removals:
            scope = {"thread_id": found.thread_id}
            if found.space_id:
                scope["space_id"] = found.space_id
            if found.channel_id:
                scope["channel_id"] = found.channel_id
            for user in users:
                payload: dict[str, object] = {
                    "thread_id": found.thread_id,
                    "message_id": found.message_id,
                }
                if self._badge is BadgeMode.UNREAD_THREADS:
                    payload["badge"] = badges.get(user, 0)
                await self._publisher.publish(
                    EphemeralEvent(
                        type=NOTIFICATION_REMOVED,
                        id=new_id(),
                        occurred_at=now,
                        audience=user,
                        resource_kind="thread",
                        resource_id=found.thread_id,
                        scope=scope,
                        payload=payload,
                    )
                )
        for u in updates:
            read: dict[str, object] = {"thread_id": u.thread_id, "seq": u.seq}
            if self._badge is BadgeMode.UNREAD_THREADS:
                read["badge"] = badges.get(u.user_id, 0)
            await self._publisher.publish(
                EphemeralEvent(
                    type=READ_UPDATED,
                    id=new_id(),
                    occurred_at=now,
                    audience=u.user_id,
                    resource_kind="thread",
                    resource_id=u.thread_id,
                    scope=None,
                    payload=read,
                    not_device=u.device_id,
                )
            )
