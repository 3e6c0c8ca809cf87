"""Closing the connections of revoked devices and deactivated people (close code 4010).

The projection of ``device.upserted`` with state ``revoked`` runs
``pg_notify('bothy_device_revoked', '{"user_id": ..., "device_id": ...}')``
inside the consumer round's transaction, so the notification arrives after the
commit. Every gateway listens on a dedicated connection and closes the
connections of that person's device only: a device is identified by (person,
device id), so another person's device with the same id stays connected.

The projection of ``user.upserted`` with ``active: false`` likewise runs
``pg_notify('bothy_user_deactivated', user_id)``; the same listener closes
every connection of that person with 4010 ``person deactivated`` (4010, not
4001: the token is still valid, and a client that took 4001 for an expired
token would fetch a new one and be refused again; 4010 says the server
refuses this identity, as HTTP answers 403).

In a cluster (a ``node_id`` given) it also listens on
:data:`~bothy_notify.store.cluster.REPLACED_CHANNEL`: a device whose older
connection is here went live on another node, and that connection (named by
node and serial) closes with 4017, as a second connection of a device does on
one node. Notifications for other nodes are ignored.

A notification sent while the listener was not connected is never delivered,
so after every (re)connection the listener also asks the database which of the
devices connected here are revoked, which of the people connected here are
inactive, and (in a cluster) which of the connections here another node holds
a newer connection of. A connection is indexed by person and device before its rows are
read at identify, so a revocation or deactivation committed in between is
seen by one side or the other.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from functools import partial

import trio

from bothy_notify.store import cluster
from bothy_notify.store.db import DEFAULT_TIMEOUTS, DatabaseTimeouts
from bothy_notify.store.listen import (
    Listener,
    Listening,
    Notification,
    delivering,
    reconnect_backoff,
)
from bothy_notify.store.projections import REVOKED_CHANNEL, USER_DEACTIVATED_CHANNEL
from gateway import queries
from gateway.closes import DEACTIVATED, REVOKED
from gateway.hub import Hub

log = logging.getLogger("bothy.gateway.revocations")


class RevocationListener:
    """Listens for revoked devices and deactivated people and closes their connections.

    Args:
        database_url: for the dedicated ``LISTEN`` connection (never logged).
        hub: the connections to close.
        retry_interval: the first wait before reconnecting after a lost connection
            (``notify.poll_interval``, doubling to 5 s: :func:`reconnect_backoff`).
        node_id: this node's id in a cluster (``None``: a single node, no
            replacement across nodes).
        timeouts: the bounds of the connection's waits (``[database]``).
    """

    def __init__(
        self,
        *,
        database_url: str,
        hub: Hub,
        retry_interval: timedelta,
        node_id: str | None = None,
        timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS,
    ) -> None:
        self._hub = hub
        self._node_id = node_id
        channels = [REVOKED_CHANNEL, USER_DEACTIVATED_CHANNEL]
        if node_id is not None:
            channels.append(cluster.REPLACED_CHANNEL)
        self.listener = Listener(
            database_url,
            channels,
            name="revocations",
            reconnect=reconnect_backoff(retry_interval.total_seconds()),
            catch_up=self._catch_up,
            timeouts=timeouts,
        )

    def __repr__(self) -> str:
        return "RevocationListener()"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting after a lost connection
        (:class:`~bothy_notify.store.listen.Listener`).

        ``task_status.started()`` is called once ``LISTEN`` is in effect.
        Cancellation: the wait ends at once, then the connection closes.
        """
        await self.listener.run(delivering(self._apply_all), task_status=task_status)

    async def _catch_up(self, listening: Listening) -> None:
        """After every (re)connection: what the notifications said while nobody
        listened, asked of the database for the connections here now."""
        connected = self._hub.devices()
        for user_id, device_id in await listening.run(queries.revoked_among, connected):
            self._hub.close_device(user_id, device_id, REVOKED)
        people = self._hub.user_ids()
        for user_id in await listening.run(queries.inactive_among, people):
            self._hub.close_user(user_id, DEACTIVATED)
        if self._node_id is not None:
            replaced = await listening.run(partial(cluster.replaced_here, node_id=self._node_id))
            for user_id, device_id, serial in replaced:
                self._hub.close_replaced(user_id, device_id, serial)

    def _apply_all(self, notifications: list[Notification]) -> None:
        for note in notifications:
            self._apply(note.channel, note.payload)

    def _apply(self, channel: str, payload: str) -> None:
        if channel == USER_DEACTIVATED_CHANNEL:
            self._hub.close_user(payload, DEACTIVATED)
        elif channel == cluster.REPLACED_CHANNEL:
            replaced = replaced_connection(payload)
            if replaced is not None and replaced[0] == self._node_id:
                self._hub.close_replaced(*replaced[1:])
        elif (key := revoked_device(payload)) is not None:
            self._hub.close_device(*key, REVOKED)


def revoked_device(payload: str) -> tuple[str, str] | None:
    """The (person, device id) of a revocation notification; ``None`` (logged) when the
    payload is not the JSON object ``{"user_id", "device_id"}`` (never trusted blindly)."""
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        user_id, device_id = parsed.get("user_id"), parsed.get("device_id")
        if isinstance(user_id, str) and isinstance(device_id, str):
            return user_id, device_id
    log.warning("a revocation notification without a person and device was ignored")
    return None


def replaced_connection(payload: str) -> tuple[str, str, str, int] | None:
    """(node, person, device, serial) of a replacement notification; ``None`` (logged)
    when the payload is not the JSON object ``{"node_id", "user_id", "device_id",
    "serial"}``."""
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        node, user, device = parsed.get("node_id"), parsed.get("user_id"), parsed.get("device_id")
        serial = parsed.get("serial")
        if (
            isinstance(node, str)
            and isinstance(user, str)
            and isinstance(device, str)
            and type(serial) is int
        ):
            return node, user, device, serial
    log.warning("a replacement notification without a node, device and serial was ignored")
    return None
