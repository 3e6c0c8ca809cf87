"""Bulk reads of the projection that decisions need (notify's adapter to the store).

Each function takes a set of keys and answers with one query, so a round
decides a whole batch of events with a handful of statements however many
recipients they have.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from bothy_notify.config import Level
from bothy_notify.notify.domain.model import Device, Window
from bothy_notify.store.db import Conn


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread's place and sequences; ``scopes`` are the IDs a membership may name
    to give read access to it (the thread, its channel, its space)."""

    thread_id: str
    space_id: str | None
    channel_id: str | None
    last_message_seq: int
    unread_floor_seq: int
    scopes: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, thread_id: str, space_id: str | None, channel_id: str | None, last: int, floor: int
    ) -> ThreadInfo:
        scopes = tuple(s for s in (thread_id, channel_id, space_id) if s)
        return cls(thread_id, space_id, channel_id, last, floor, scopes)


@dataclass(frozen=True, slots=True)
class Person:
    human: bool
    active: bool
    categories_off: frozenset[str]


UNKNOWN_PERSON = Person(human=False, active=False, categories_off=frozenset())
"""A person the projection has never heard of receives nothing."""


def threads(conn: Conn, thread_ids: Collection[str]) -> dict[str, ThreadInfo]:
    if not thread_ids:
        return {}
    rows = conn.execute(
        "SELECT thread_id, space_id, channel_id, last_message_seq, unread_floor_seq"
        " FROM bothy.threads WHERE thread_id = ANY(%s)",
        (list(thread_ids),),
    ).fetchall()
    return {r[0]: ThreadInfo.of(*r) for r in rows}


def follow_rows(conn: Conn, thread_ids: Collection[str]) -> dict[str, dict[str, Level]]:
    """Every stored follow level of these threads: thread -> user -> level."""
    out: dict[str, dict[str, Level]] = defaultdict(dict)
    if thread_ids:
        rows = conn.execute(
            "SELECT thread_id, user_id, level FROM bothy.follows WHERE thread_id = ANY(%s)",
            (list(thread_ids),),
        ).fetchall()
        levels = _LEVELS
        for thread_id, user_id, level in rows:
            out[thread_id][user_id] = levels[level]
    return out


_LEVELS = {level.value: level for level in Level}


def members_of_scopes(conn: Conn, scope_ids: Collection[str]) -> dict[str, set[str]]:
    """scope -> members; used when ``notify.default_level`` is ``all``."""
    out: dict[str, set[str]] = defaultdict(set)
    if scope_ids:
        for scope_id, user_id in conn.execute(
            "SELECT scope_id, user_id FROM bothy.members WHERE scope_id = ANY(%s)",
            (list(scope_ids),),
        ):
            out[scope_id].add(user_id)
    return out


def people(conn: Conn, user_ids: Collection[str]) -> dict[str, Person]:
    if not user_ids:
        return {}
    rows = conn.execute(
        "SELECT u.user_id, u.kind, u.active, p.categories"
        " FROM bothy.users u LEFT JOIN bothy.preferences p USING (user_id)"
        " WHERE u.user_id = ANY(%s)",
        (list(user_ids),),
    ).fetchall()
    out: dict[str, Person] = {}
    for user_id, kind, active, categories in rows:
        off = frozenset(k for k, v in (categories or {}).items() if v is False)
        out[user_id] = Person(human=kind == "human", active=active, categories_off=off)
    return out


def memberships(
    conn: Conn, user_ids: Collection[str], scope_ids: Collection[str]
) -> set[tuple[str, str]]:
    """(user, scope) pairs among these users and scopes."""
    if not user_ids or not scope_ids:
        return set()
    return {
        (r[0], r[1])
        for r in conn.execute(
            "SELECT user_id, scope_id FROM bothy.members"
            " WHERE user_id = ANY(%s) AND scope_id = ANY(%s)",
            (list(user_ids), list(scope_ids)),
        )
    }


def last_reads(conn: Conn, pairs: Collection[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """(user, thread) -> last_read_seq for stored rows."""
    if not pairs:
        return {}
    users = [p[0] for p in pairs]
    thread_ids = [p[1] for p in pairs]
    return {
        (r[0], r[1]): r[2]
        for r in conn.execute(
            "SELECT r.user_id, r.thread_id, r.last_read_seq FROM bothy.read_states r"
            " JOIN unnest(%s::text[], %s::text[]) AS k(user_id, thread_id)"
            " ON r.user_id = k.user_id AND r.thread_id = k.thread_id",
            (users, thread_ids),
        )
    }


def devices(conn: Conn, user_ids: Collection[str]) -> dict[str, tuple[Device, ...]]:
    """user -> active devices that hold active registrations, with those registrations.

    A device without a row counts as active (its row may still be on its way).
    """
    if not user_ids:
        return {}
    per_device: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for user_id, device_id, platform, reg_id in conn.execute(
        "SELECT r.user_id, r.device_id, coalesce(d.platform, 'web'), r.id"
        " FROM bothy.push_registrations r"
        " LEFT JOIN bothy.devices d ON d.device_id = r.device_id"
        " WHERE r.user_id = ANY(%s) AND r.invalidated_at IS NULL"
        "   AND coalesce(d.state, 'active') = 'active'"
        " ORDER BY r.user_id, r.device_id, r.id",
        (list(user_ids),),
    ):
        per_device.setdefault((user_id, device_id), (platform, []))[1].append(reg_id)
    out: dict[str, list[Device]] = defaultdict(list)
    for (user_id, device_id), (platform, regs) in per_device.items():
        out[user_id].append(Device(device_id, platform, tuple(regs)))
    return {u: tuple(ds) for u, ds in out.items()}


def windows(conn: Conn, pairs: Collection[tuple[str, str]]) -> dict[tuple[str, str], Window]:
    """(user, thread) -> the stored coalescing window."""
    if not pairs:
        return {}
    users = [p[0] for p in pairs]
    thread_ids = [p[1] for p in pairs]
    out: dict[tuple[str, str], Window] = {}
    for row in conn.execute(
        "SELECT w.user_id, w.thread_id, w.opened_at, w.closes_at, w.count, w.first_seq,"
        " w.newest_seq, w.newest_message_id, w.mention FROM bothy.hint_windows w"
        " JOIN unnest(%s::text[], %s::text[]) AS k(user_id, thread_id)"
        " ON w.user_id = k.user_id AND w.thread_id = k.thread_id",
        (users, thread_ids),
    ):
        out[(row[0], row[1])] = Window(*row[2:])
    return out


def save_windows(conn: Conn, changed: Iterable[tuple[str, str, Window]]) -> None:
    """Upsert windows (an opened window replaces a closed one of the same key)."""
    rows = [
        (
            u,
            t,
            w.opened_at,
            w.closes_at,
            w.count,
            w.first_seq,
            w.newest_seq,
            w.newest_message_id,
            w.mention,
        )
        for u, t, w in changed
    ]
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.hint_windows (user_id, thread_id, opened_at, closes_at, count,"
                " first_seq, newest_seq, newest_message_id, mention)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (user_id, thread_id) DO UPDATE SET opened_at = EXCLUDED.opened_at,"
                " closes_at = EXCLUDED.closes_at, count = EXCLUDED.count,"
                " first_seq = EXCLUDED.first_seq, newest_seq = EXCLUDED.newest_seq,"
                " newest_message_id = EXCLUDED.newest_message_id, mention = EXCLUDED.mention",
                rows,
            )
