"""The projection: the app's facts that decisions need, kept from the event log.

:func:`apply` runs inside the consumer round's transaction, in log order.
Every statement is idempotent for the same event, and the read position only
moves forward. The HTTP API writes read positions and follow levels through
the same functions, so both ways in have one meaning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bothy_notify.store import marks
from bothy_notify.store.db import Conn
from bothy_notify.store.marks import Clearing

Payload = Mapping[str, Any]

USER_DEACTIVATED_CHANNEL = "bothy_user_deactivated"
"""``NOTIFY`` channel told the ID of every person ``user.upserted`` leaves inactive
(the gateway closes their connections)."""


def upsert_user(conn: Conn, p: Payload) -> None:
    """Project ``user.upserted``; an inactive person's ID goes to every gateway."""
    conn.execute(
        "INSERT INTO bothy.users (user_id, kind, active) VALUES (%s, %s, %s)"
        " ON CONFLICT (user_id) DO UPDATE SET kind = EXCLUDED.kind, active = EXCLUDED.active,"
        " updated_at = now()",
        (p["user_id"], p["kind"], p["active"]),
    )
    if not p["active"]:
        conn.execute("SELECT pg_notify(%s, %s)", (USER_DEACTIVATED_CHANNEL, p["user_id"]))


REVOKED_CHANNEL = "bothy_device_revoked"
"""``NOTIFY`` channel of a revoked device; the payload is JSON
``{"user_id": ..., "device_id": ...}`` (IDs only), read by ``gateway.revocations``."""


@dataclass(frozen=True, slots=True)
class DeviceChange:
    """What projecting ``device.upserted`` did: the state the device left (``None`` if
    new) and how many registrations a revocation invalidated."""

    before: str | None
    invalidated: int = 0


def upsert_device(conn: Conn, p: Payload) -> DeviceChange:
    """Project ``device.upserted`` for the device of (``user_id``, ``device_id``).

    A device is the person's own: another person's device with the same id is
    never read or changed.
    """
    key = (p["user_id"], p["device_id"])
    row = conn.execute(
        "SELECT state FROM bothy.devices WHERE user_id = %s AND device_id = %s FOR UPDATE", key
    ).fetchone()
    conn.execute(
        "INSERT INTO bothy.devices (user_id, device_id, platform, state) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (user_id, device_id) DO UPDATE SET"
        " platform = EXCLUDED.platform, state = EXCLUDED.state, updated_at = now()",
        (*key, p["platform"], p["state"]),
    )
    invalidated = 0
    if p["state"] == "revoked":
        invalidated = revoke_device(conn, *key)
    return DeviceChange(row[0] if row else None, invalidated)


def revoke_device(conn: Conn, user_id: str, device_id: str) -> int:
    """Invalidate the registrations of one person's revoked device and tell every
    gateway (IDs only); returns how many registrations were active until now."""
    invalidated = conn.execute(
        "UPDATE bothy.push_registrations SET invalidated_at = now(),"
        " last_error = coalesce(last_error, 'device_revoked')"
        " WHERE user_id = %s AND device_id = %s AND invalidated_at IS NULL",
        (user_id, device_id),
    ).rowcount
    payload = json.dumps({"user_id": user_id, "device_id": device_id}, separators=(",", ":"))
    conn.execute("SELECT pg_notify(%s, %s)", (REVOKED_CHANNEL, payload))
    return invalidated


def upsert_thread(conn: Conn, p: Payload) -> None:
    conn.execute(
        "INSERT INTO bothy.threads (thread_id, space_id, channel_id, unread_floor_seq)"
        " VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (thread_id) DO UPDATE SET space_id = EXCLUDED.space_id,"
        " channel_id = EXCLUDED.channel_id,"
        " unread_floor_seq = greatest(bothy.threads.unread_floor_seq, EXCLUDED.unread_floor_seq)",
        (p["thread_id"], p.get("space_id"), p.get("channel_id"), p.get("unread_floor_seq", 0)),
    )


def add_member(conn: Conn, p: Payload) -> None:
    conn.execute(
        "INSERT INTO bothy.members (scope_id, user_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (p["scope_id"], p["user_id"]),
    )


def remove_member(conn: Conn, p: Payload) -> None:
    conn.execute(
        "DELETE FROM bothy.members WHERE scope_id = %s AND user_id = %s",
        (p["scope_id"], p["user_id"]),
    )


def set_follow(conn: Conn, p: Payload) -> None:
    conn.execute(
        "INSERT INTO bothy.follows (thread_id, user_id, level) VALUES (%s, %s, %s)"
        " ON CONFLICT (thread_id, user_id) DO UPDATE SET level = EXCLUDED.level",
        (p["thread_id"], p["user_id"], p["level"]),
    )


READ_UPDATED_CHANNEL = "bothy_read_updated"
"""``NOTIFY`` channel of a read position moved forward; the payload is JSON
``{"user_id", "thread_id", "seq", "device_id"?}`` (IDs and an integer), read by
``gateway.reads`` (the ``read.updated`` frame)."""


def mark_read(conn: Conn, p: Payload, clearing: Clearing | None = None) -> int:
    """Move the read position forward (never back); return the stored ``last_read_seq``.

    Every path writes the position here (the ``thread.read`` event, the gateway's
    ``read`` op and ``PUT /v1/threads/{id}/read``, which give the reading device as
    ``p["device_id"]``). When it moves forward: with ``clearing``
    (``push.clear_on_read``), the person's marked registrations but the reading
    device's get their clear queued (:func:`bothy_notify.store.marks.queue_clears`),
    and every gateway is told on :data:`READ_UPDATED_CHANNEL` at commit.
    """
    key = (p["user_id"], p["thread_id"])
    row = conn.execute(
        "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq) VALUES (%s, %s, %s)"
        " ON CONFLICT (user_id, thread_id) DO UPDATE SET last_read_seq = EXCLUDED.last_read_seq"
        " WHERE bothy.read_states.last_read_seq < EXCLUDED.last_read_seq"
        " RETURNING last_read_seq",
        (*key, p["seq"]),
    ).fetchone()
    if row is not None:
        device_id = p.get("device_id")
        if clearing is not None:
            marks.queue_clears(conn, *key, clearing, device_id)
        note = {"user_id": key[0], "thread_id": key[1], "seq": int(row[0])}
        if device_id is not None:
            note["device_id"] = device_id
        conn.execute(
            "SELECT pg_notify(%s, %s)",
            (READ_UPDATED_CHANNEL, json.dumps(note, separators=(",", ":"))),
        )
        return int(row[0])
    row = conn.execute(
        "SELECT last_read_seq FROM bothy.read_states WHERE user_id = %s AND thread_id = %s", key
    ).fetchone()
    assert row is not None
    return int(row[0])


def record_messages(conn: Conn, messages: list[tuple[str, int]]) -> None:
    """Raise ``last_message_seq`` of threads for (thread_id, thread_seq) pairs; create
    threads never seen."""
    if not messages:
        return
    latest: dict[str, int] = {}
    for thread_id, seq in messages:
        latest[thread_id] = max(seq, latest.get(thread_id, 0))
    # Threads that move: one UPDATE of those whose sequence rises (no new row version
    # for the others); threads never seen: inserted. Keys travel as JSON arrays (a
    # text[] parameter is built element by element in Python). The insert's ON
    # CONFLICT covers a thread another transaction created meanwhile. Both reach the
    # threads by their key, however many (the planner, guessing 100 keys, scanned
    # the table; see notify/facts.py on the forms): the update through ``= ANY``, the
    # check through a sub-select per key that OFFSET 0 keeps from becoming a join.
    conn.execute(
        "WITH k AS (SELECT id, seq::bigint AS seq FROM ROWS FROM"
        "   (json_array_elements_text(%s::json), json_array_elements_text(%s::json))"
        "   AS k(id, seq)),"
        " raised AS (UPDATE bothy.threads t SET last_message_seq = k.seq FROM k"
        "   WHERE t.thread_id = ANY(ARRAY(SELECT id FROM k)) AND t.thread_id = k.id"
        "   AND t.last_message_seq < k.seq)"
        " INSERT INTO bothy.threads (thread_id, last_message_seq)"
        " SELECT k.id, k.seq FROM k"
        " WHERE NOT EXISTS (SELECT 1 FROM bothy.threads t WHERE t.thread_id = k.id OFFSET 0)"
        " ON CONFLICT (thread_id) DO UPDATE SET last_message_seq ="
        " greatest(bothy.threads.last_message_seq, EXCLUDED.last_message_seq)",
        (json.dumps(list(latest)), json.dumps(list(latest.values()))),
    )


def _noop(conn: Conn, p: Payload) -> None:
    """Events whose effect is a hint only (no projected fact)."""


PROJECTIONS: dict[str, Callable[[Conn, Payload], object]] = {
    "user.upserted": upsert_user,
    "device.upserted": upsert_device,
    "thread.upserted": upsert_thread,
    "member.added": add_member,
    "member.removed": remove_member,
    "thread.followed": set_follow,
    "thread.read": mark_read,
    "access.expiring": _noop,
    "hint.requested": _noop,
}
"""Projection of every event type except ``message.created`` (batched by the round)."""
