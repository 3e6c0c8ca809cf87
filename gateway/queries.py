"""The reads and writes the gateway makes, each run inside one ``Database.run`` call.

They reuse the store's functions where one exists (``ensure_device``,
``mark_read``), so the gateway and the HTTP API give every fact one meaning.
Read access comes from :mod:`bothy_notify.store.access`, the one meaning the
notify jobs use too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bothy_notify.auth import DeviceClaims
from bothy_notify.store import people, projections, registrations
from bothy_notify.store.access import may_read, readable_threads
from bothy_notify.store.db import Conn
from bothy_notify.store.marks import Clearing
from bothy_notify.store.people import inactive_among
from bothy_notify.store.unread import unread_threads_of

DEACTIVATED = people.DEACTIVATED
"""What :func:`identify` answers for a person the app deactivated."""


Identified = tuple[str, list[tuple[str, int]], float]
"""What :func:`identify` answers: the device's state, the unread snapshot, and the
seconds left of the device's 4029 cooldown (0: none)."""

_REFUSED = ("revoked", people.DEACTIVATED)


def identify(conn: Conn, *, claims: DeviceClaims) -> Identified:
    """Create or update the device row from the claims; the unread snapshot.

    Returns the device's state (``revoked`` means refuse), or
    :data:`DEACTIVATED` for a deactivated person (nothing written); unless
    refused or cooling down, the person's followed, readable threads with unread
    messages as ``(thread_id, unread)`` pairs; and the seconds left of the
    device's cooldown after a 4029 close on any process or node
    (:func:`start_cooldown`; the identify is then refused with 4029).
    """
    return identify_many(conn, [claims])[0]


def identify_many(conn: Conn, claims: Sequence[DeviceClaims]) -> list[Identified]:
    """:func:`identify` for many connections in one transaction (four statements),
    each one's answer in order: what identifying them one by one would answer."""
    rows = people.admit_devices(
        conn, [(c.user_id, c.device_id, c.platform, c.kind) for c in claims]
    )
    served = [r.state not in _REFUSED and r.cooling <= 0 for r in rows]
    unread = unread_threads_of(
        conn, {c.user_id for c, ok in zip(claims, served, strict=True) if ok}
    )
    return [
        (r.state, unread.get(c.user_id, []) if ok else [], r.cooling)
        for c, r, ok in zip(claims, rows, served, strict=True)
    ]


def start_cooldown(conn: Conn, *, user_id: str, device_id: str, seconds: float) -> None:
    """Refuse the device at identify for ``seconds``, on every process and node: a 4029
    close (:func:`bothy_notify.store.registrations.start_cooldown`)."""
    registrations.start_cooldown(conn, user_id=user_id, device_id=device_id, seconds=seconds)


def unread_threads(conn: Conn, user_id: str) -> list[tuple[str, int]]:
    """Followed (level ``all`` or ``mentions``), readable threads with unread messages.

    ``unread`` is ``last_message_seq - max(last_read_seq, unread_floor_seq)``.
    """
    return unread_threads_of(conn, [user_id]).get(user_id, [])


def mark_read(
    conn: Conn,
    *,
    user_id: str,
    thread_id: str,
    seq: int,
    device_id: str | None = None,
    clearing: Clearing | None = None,
) -> int:
    """Move the read position forward if the person may read the thread; the stored
    ``last_read_seq`` either way (0 when none is stored).

    A thread the person cannot read, or that does not exist, stores nothing, and
    the answer says only what was stored before: whether the thread exists
    never shows.
    """
    if may_read(conn, user_id=user_id, thread_id=thread_id):
        position = {"user_id": user_id, "thread_id": thread_id, "seq": seq, "device_id": device_id}
        return projections.mark_read(conn, position, clearing)
    row = conn.execute(
        "SELECT last_read_seq FROM bothy.read_states WHERE user_id = %s AND thread_id = %s",
        (user_id, thread_id),
    ).fetchone()
    return int(row[0]) if row else 0


def revoked_among(conn: Conn, devices: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
    """The devices, as (person, device id), among ``devices`` whose state is ``revoked``."""
    if not devices:
        return set()
    keys = list(devices)
    rows = conn.execute(
        "SELECT d.user_id, d.device_id FROM bothy.devices d"
        " JOIN unnest(%s::text[], %s::text[]) AS k(user_id, device_id)"
        " ON d.user_id = k.user_id AND d.device_id = k.device_id WHERE d.state = 'revoked'",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(str(r[0]), str(r[1])) for r in rows}


__all__ = [
    "identify",
    "identify_many",
    "inactive_among",
    "mark_read",
    "may_read",
    "readable_threads",
    "revoked_among",
    "start_cooldown",
    "unread_threads",
    "unread_threads_of",
]
