"""A notify request of the Matrix Push Gateway API as values, and its answer; no IO.

``POST /_matrix/push/v1/notify`` carries ``{"notification": {...}}`` (the
spec's ``Notification``): ``event_id``, ``room_id``, ``type``, ``sender``,
``sender_display_name``, ``room_name``, ``room_alias``, ``user_is_target``,
``prio``, ``content``, ``counts`` (``unread``, ``missed_calls``) and
``devices`` (each ``app_id``, ``pushkey``, ``pushkey_ts``, ``data``,
``tweaks``). :func:`parse` reads only what a content-free push carries and
never looks at the rest: the type, sender, names, alias, membership and
content are not read, so nothing of them can reach a phone, a job, a log line
or the database, whatever the homeserver sent (SPEC section 14c).

What :func:`parse` refuses, as :class:`BadNotification` (answered 400
``M_BAD_JSON`` with a constant message naming the member, never its value):

=========================================  ======================================
the body                                   not an object with a ``notification``
                                           object
``devices``                                not a list of 1 to ``max_devices``
                                           objects
a device's ``app_id``, ``pushkey``         not a non-empty string (a pushkey at
                                           most :data:`PUSHKEY_MAX` characters)
a device's ``pushkey_ts``                  present and not an integer of 0 to 2**53 - 1
a device's ``data``, ``tweaks``            present and not an object
``event_id``, ``room_id``                  present and not an ID (:data:`MATRIX_ID`)
``counts.unread``, ``counts.missed_calls``  present and not an integer of 0 to 2**53 - 1
``prio``                                   present and neither ``high`` nor ``low``
=========================================  ======================================

A member given as ``null`` counts as absent (Synapse's badge updates send
``"type": null``); an empty ``event_id`` or ``room_id`` too. A notification
without an ``event_id`` is a badge update: it pushes the counts alone.

A device listed twice (the same app id and pushkey) is one device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PUSHKEY_MAX = 4096
"""Longest pushkey read: the spec allows 512 bytes; a Web Push endpoint given as the
pushkey (``webpush`` apps) is at most 2,048 characters."""
MATRIX_ID = re.compile(r"[\x21-\x7e]{1,255}")
"""An event or room ID: printable ASCII without spaces, at most 255 bytes (the spec's
limit). The sigil (``$``, ``!``) is not required: a Bothy node relaying through this
gateway sends its hint's ``nid`` and thread id (SPEC section 14c), and Sygnal does not
check one either."""
PRIO_URGENCY: Mapping[str, str] = {"high": "normal", "low": "low"}
"""The urgency of each ``prio``: ``high`` (the spec's default) is a message hint's
``normal`` (delivered at once: FCM priority HIGH, APNs priority 10 in alert style),
``low`` is ``low`` (FCM priority NORMAL, APNs priority 5, Web Push ``Urgency: low``)."""
DEFAULT_PRIO = "high"
INTEGER_MAX = 2**53 - 1
"""The largest count or ``pushkey_ts`` read (JavaScript holds every integer up to it)."""


class BadNotification(ValueError):
    """The body is not a notification this gateway reads; the message is constant
    (it names the member, never the value)."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a notification: the pusher's app id and pushkey, when the
    pushkey was set (``pushkey_ts``, Unix seconds; 0 when not given) and the
    pusher's ``data`` (only a ``webpush`` app reads it: the subscription's keys).
    The repr shows the app id only."""

    app_id: str
    pushkey: str
    pushkey_ts: int = 0
    data: Mapping[str, Any] | None = None

    def __repr__(self) -> str:
        return f"Device(app_id={self.app_id!r})"


@dataclass(frozen=True, slots=True)
class Notification:
    """What a content-free push of a notify request carries, and its devices.

    ``event_id`` and ``room_id`` are ``None`` for a badge update. ``urgency`` is
    from ``prio`` (:data:`PRIO_URGENCY`). The repr shows no ID.
    """

    event_id: str | None
    room_id: str | None
    unread: int | None
    missed_calls: int | None
    urgency: str
    devices: tuple[Device, ...]

    @property
    def badge_only(self) -> bool:
        """A badge update: no event, the counts alone."""
        return self.event_id is None

    def __repr__(self) -> str:
        return f"Notification(devices={len(self.devices)}, badge_only={self.badge_only})"


def _absent(value: object) -> bool:
    return value is None


def _count(counts: Mapping[str, Any], name: str) -> int | None:
    value = counts.get(name)
    if _absent(value):
        return None
    if type(value) is not int or not 0 <= value <= INTEGER_MAX:
        raise BadNotification(f"notification.counts.{name}: expected a non-negative integer")
    return value


def _matrix_id(notification: Mapping[str, Any], name: str) -> str | None:
    value = notification.get(name)
    if _absent(value) or value == "":
        return None
    if not isinstance(value, str) or MATRIX_ID.fullmatch(value) is None:
        raise BadNotification(
            f"notification.{name}: expected an ID of 1 to 255 printable ASCII characters"
        )
    return value


def _device(raw: object, i: int) -> Device:
    where = f"notification.devices[{i}]"
    if not isinstance(raw, dict):
        raise BadNotification(f"{where}: expected an object")
    app_id = raw.get("app_id")
    if not isinstance(app_id, str) or not app_id:
        raise BadNotification(f"{where}.app_id: expected a non-empty string")
    pushkey = raw.get("pushkey")
    if not isinstance(pushkey, str) or not pushkey or len(pushkey) > PUSHKEY_MAX:
        raise BadNotification(
            f"{where}.pushkey: expected a string of 1 to {PUSHKEY_MAX} characters"
        )
    pushkey_ts = raw.get("pushkey_ts")
    if _absent(pushkey_ts):
        pushkey_ts = 0
    elif type(pushkey_ts) is not int or not 0 <= pushkey_ts <= INTEGER_MAX:
        raise BadNotification(f"{where}.pushkey_ts: expected a non-negative integer")
    for name in ("data", "tweaks"):
        value = raw.get(name)
        if not _absent(value) and not isinstance(value, dict):
            raise BadNotification(f"{where}.{name}: expected an object")
    data = raw.get("data")
    return Device(app_id, pushkey, pushkey_ts, data if isinstance(data, dict) else None)


def parse(body: object, *, max_devices: int) -> Notification:
    """The notification of a notify request's parsed JSON ``body``.

    Reads ``event_id``, ``room_id``, ``counts``, ``prio`` and ``devices`` only
    (see the module docstring). Raises :class:`BadNotification`.
    """
    if not isinstance(body, dict):
        raise BadNotification("the body: expected an object")
    notification = body.get("notification")
    if not isinstance(notification, dict):
        raise BadNotification("notification: expected an object")
    devices = notification.get("devices")
    if not isinstance(devices, list) or not devices:
        raise BadNotification("notification.devices: expected a list of at least one device")
    if len(devices) > max_devices:
        raise BadNotification(f"notification.devices: at most {max_devices} devices")
    counts = notification.get("counts")
    if _absent(counts):
        counts = {}
    elif not isinstance(counts, dict):
        raise BadNotification("notification.counts: expected an object")
    prio = notification.get("prio")
    if _absent(prio):
        prio = DEFAULT_PRIO
    elif prio not in PRIO_URGENCY:
        raise BadNotification("notification.prio: expected high or low")
    parsed: dict[tuple[str, str], Device] = {}
    for i, raw in enumerate(devices):
        device = _device(raw, i)
        parsed.setdefault((device.app_id, device.pushkey), device)
    event_id = _matrix_id(notification, "event_id")
    return Notification(
        event_id=event_id,
        room_id=_matrix_id(notification, "room_id"),
        unread=_count(counts, "unread"),
        missed_calls=_count(counts, "missed_calls"),
        urgency=PRIO_URGENCY[str(prio)],
        devices=tuple(parsed.values()),
    )


def answer(rejected: Sequence[str]) -> dict[str, list[str]]:
    """The 200 answer: the pushkeys the homeserver should stop pushing to (each once,
    in the order of the request's devices)."""
    return {"rejected": list(dict.fromkeys(rejected))}


def error(errcode: str, message: str) -> dict[str, str]:
    """A Matrix error body (``{"errcode", "error"}``); ``message`` is constant text."""
    return {"errcode": errcode, "error": message}
