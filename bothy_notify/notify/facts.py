"""Bulk reads of the projection that decisions need (notify's adapter to the store).

Each function takes a set of keys and answers with one query, so a round
decides a whole batch of events with a handful of statements however many
recipients they have.

With ``cluster.mode = "multi"`` presence is one of these facts too
(:class:`SharedPresence`): the union of the presence every live node published
to ``bothy.presence``, read in the same pipeline as the rest of a group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bothy_notify.config import Level
from bothy_notify.kernel.presence import PresenceEntry, PresenceView
from bothy_notify.notify.domain.model import Device, Window
from bothy_notify.store.db import Conn


@dataclass(frozen=True, slots=True)
class SharedPresence:
    """Presence as the cluster's gateway nodes published it (``cluster.mode = "multi"``).

    Not read through the :class:`PresenceView` port but inside the group read
    (:func:`load_group`): one more statement in the same pipeline, so a group's
    presence and its other facts come from one round trip. Only rows of live
    nodes count (heartbeat at or after ``now - cluster.node_timeout``): a gone
    node's connections stop counting at once, before anyone removes its rows.

    Attributes:
        node_timeout: ``cluster.node_timeout``.
    """

    node_timeout: timedelta

    def since(self, now: datetime) -> datetime:
        """The oldest heartbeat of a node that is still live at ``now``."""
        return now - self.node_timeout


PresenceSource = PresenceView | SharedPresence
"""Where a decision takes presence from: this process's view (the hub's, or
nobody's), or the cluster's shared table."""


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


_THREADS = (
    "SELECT thread_id, space_id, channel_id, last_message_seq, unread_floor_seq"
    " FROM bothy.threads WHERE thread_id = ANY(%s)"
)
_FOLLOWS = "SELECT thread_id, user_id, level FROM bothy.follows WHERE thread_id = ANY(%s)"
_ACCESS = (
    # Only the group's (recipient, thread) pairs: every recipient against every thread
    # would be B^2 rows for B messages in one big space (250,000 at a batch of 500).
    "SELECT k.user_id, k.thread_id FROM unnest(%s::text[], %s::text[]) AS k(user_id, thread_id)"
    " JOIN bothy.threads t ON t.thread_id = k.thread_id"
    " WHERE EXISTS (SELECT 1 FROM bothy.members m WHERE m.user_id = k.user_id"
    "   AND m.scope_id IN (t.thread_id, t.channel_id, t.space_id))"
)
_READS = (
    "SELECT r.user_id, r.thread_id, r.last_read_seq FROM bothy.read_states r"
    " JOIN unnest(%s::text[], %s::text[]) AS k(user_id, thread_id)"
    " ON r.user_id = k.user_id AND r.thread_id = k.thread_id"
)
_PEOPLE = (
    "SELECT u.user_id, u.kind, u.active, p.categories"
    " FROM bothy.users u LEFT JOIN bothy.preferences p USING (user_id)"
    " WHERE u.user_id = ANY(%s)"
)
# A device without a row counts as active (its row may still be on its way). A device
# is the person's own: (user_id, device_id) is its key.
_DEVICES = (
    "SELECT r.user_id, r.device_id, coalesce(d.platform, 'web'), r.id"
    " FROM bothy.push_registrations r"
    " LEFT JOIN bothy.devices d ON d.user_id = r.user_id AND d.device_id = r.device_id"
    " WHERE r.user_id = ANY(%s) AND r.invalidated_at IS NULL"
    "   AND coalesce(d.state, 'active') = 'active'"
    " ORDER BY r.user_id, r.device_id, r.id"
)
_WINDOWS = (
    "SELECT w.user_id, w.thread_id, w.opened_at, w.closes_at, w.count, w.first_seq,"
    " w.newest_seq, w.newest_message_id, w.mention FROM bothy.hint_windows w"
    " JOIN unnest(%s::text[], %s::text[]) AS k(user_id, thread_id)"
    " ON w.user_id = k.user_id AND w.thread_id = k.thread_id"
)
# Rows of live nodes only; a device live on two nodes at once (it moved, and the
# older connection is not closed yet) counts once: its newest connection wins
# (live_seq, the order in which the cluster learnt of the connections).
_PRESENCE = (
    "SELECT p.user_id, p.device_id, p.platform, p.focus, p.idle, p.node_id::text"
    " FROM bothy.presence p JOIN bothy.nodes n ON n.node_id = p.node_id"
    " WHERE p.user_id = ANY(%s) AND n.seen_at >= %s"
    " ORDER BY p.live_seq, p.updated_at, p.node_id"
)
_LEVELS = {level.value: level for level in Level}

Rows = list[tuple[Any, ...]]


def _threads(rows: Rows) -> dict[str, ThreadInfo]:
    return {r[0]: ThreadInfo.of(*r) for r in rows}


def _follows(rows: Rows) -> dict[str, dict[str, Level]]:
    out: dict[str, dict[str, Level]] = defaultdict(dict)
    levels = _LEVELS
    for thread_id, user_id, level in rows:
        out[thread_id][user_id] = levels[level]
    return out


def _people(rows: Rows) -> dict[str, Person]:
    out: dict[str, Person] = {}
    for user_id, kind, active, categories in rows:
        off = frozenset(k for k, v in (categories or {}).items() if v is False)
        out[user_id] = Person(human=kind == "human", active=active, categories_off=off)
    return out


def _devices(rows: Rows) -> dict[str, tuple[Device, ...]]:
    per_device: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for user_id, device_id, platform, reg_id in rows:
        per_device.setdefault((user_id, device_id), (platform, []))[1].append(reg_id)
    out: dict[str, list[Device]] = defaultdict(list)
    for (user_id, device_id), (platform, regs) in per_device.items():
        out[user_id].append(Device(device_id, platform, tuple(regs)))
    return {u: tuple(ds) for u, ds in out.items()}


def _windows(rows: Rows) -> dict[tuple[str, str], Window]:
    return {(r[0], r[1]): Window(*r[2:]) for r in rows}


def _presence(
    rows: Rows,
) -> tuple[dict[str, tuple[PresenceEntry, ...]], dict[str, dict[str, str]]]:
    latest: dict[tuple[str, str], tuple[PresenceEntry, str]] = {}
    for user_id, device_id, platform, focus, idle, node_id in rows:
        entry = PresenceEntry(device_id, platform, frozenset(focus), idle)
        latest[(user_id, device_id)] = (entry, node_id)
    per_user: dict[str, list[PresenceEntry]] = defaultdict(list)
    holders: dict[str, dict[str, str]] = defaultdict(dict)
    for (user_id, device_id), (entry, node_id) in latest.items():
        per_user[user_id].append(entry)
        holders[user_id][device_id] = node_id
    return {u: tuple(es) for u, es in per_user.items()}, dict(holders)


def threads(conn: Conn, thread_ids: Collection[str]) -> dict[str, ThreadInfo]:
    if not thread_ids:
        return {}
    return _threads(conn.execute(_THREADS, (list(thread_ids),)).fetchall())


def follow_rows(conn: Conn, thread_ids: Collection[str]) -> dict[str, dict[str, Level]]:
    """Every stored follow level of these threads: thread -> user -> level."""
    if not thread_ids:
        return defaultdict(dict)
    return _follows(conn.execute(_FOLLOWS, (list(thread_ids),)).fetchall())


def members_of_scopes(conn: Conn, scope_ids: Collection[str]) -> dict[str, set[str]]:
    """scope -> members; used when ``notify.default_level`` is ``all``."""
    out: dict[str, set[str]] = defaultdict(set)
    if scope_ids:
        for scope_id, user_id in conn.execute(
            "SELECT scope_id, user_id FROM bothy.members WHERE scope_id = ANY(%s)",
            (list(scope_ids),),
        ).fetchall():
            out[scope_id].add(user_id)
    return out


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """Everything a group of hints needs, read at one point of the round.

    Attributes:
        infos: thread -> its place and sequences.
        follows: thread -> user -> stored follow level.
        readable: (user, thread) pairs with read access now.
        reads: (user, thread) -> stored ``last_read_seq``.
        people: user -> kind, active, categories switched off.
        devices: user -> active devices with active registrations.
        windows: (user, thread) -> stored coalescing window.
        presence: user -> the live entries of the shared presence (read only
            with ``presence_since``; empty otherwise).
        holders: user -> device -> the node holding that live connection.
    """

    infos: dict[str, ThreadInfo]
    follows: dict[str, dict[str, Level]]
    readable: set[tuple[str, str]]
    reads: dict[tuple[str, str], int]
    people: dict[str, Person]
    devices: dict[str, tuple[Device, ...]]
    windows: dict[tuple[str, str], Window]
    presence: dict[str, tuple[PresenceEntry, ...]] = field(default_factory=dict)
    holders: dict[str, dict[str, str]] = field(default_factory=dict)


def load_group(
    conn: Conn,
    *,
    users: Collection[str],
    pairs: Collection[tuple[str, str]],
    follows: dict[str, dict[str, Level]] | None,
    with_windows: bool,
    presence_since: datetime | None = None,
) -> GroupFacts:
    """Read a group's facts with every query in one pipeline (one round trip).

    ``pairs`` are the (recipient, thread) pairs of hints with a thread;
    ``follows`` may be passed when the caller read them already. With
    ``presence_since`` the shared presence of nodes live since then is read
    too (:class:`SharedPresence`).
    """
    user_list = list(users)
    thread_list = sorted({t for _u, t in pairs})
    pair_users = [p[0] for p in pairs]
    pair_threads = [p[1] for p in pairs]
    with conn.pipeline():
        c_threads = conn.execute(_THREADS, (thread_list,)) if thread_list else None
        c_follows = (
            conn.execute(_FOLLOWS, (thread_list,)) if thread_list and follows is None else None
        )
        c_access = conn.execute(_ACCESS, (pair_users, pair_threads)) if pairs else None
        c_reads = conn.execute(_READS, (pair_users, pair_threads)) if pairs else None
        c_people = conn.execute(_PEOPLE, (user_list,))
        c_devices = conn.execute(_DEVICES, (user_list,))
        c_windows = (
            conn.execute(_WINDOWS, (pair_users, pair_threads)) if pairs and with_windows else None
        )
        c_presence = (
            conn.execute(_PRESENCE, (user_list, presence_since))
            if presence_since is not None
            else None
        )
    presence, holders = _presence(c_presence.fetchall()) if c_presence else ({}, {})
    return GroupFacts(
        infos=_threads(c_threads.fetchall()) if c_threads else {},
        follows=follows
        if follows is not None
        else (_follows(c_follows.fetchall()) if c_follows else defaultdict(dict)),
        readable={(r[0], r[1]) for r in c_access.fetchall()} if c_access else set(),
        reads={(r[0], r[1]): r[2] for r in c_reads.fetchall()} if c_reads else {},
        people=_people(c_people.fetchall()),
        devices=_devices(c_devices.fetchall()),
        windows=_windows(c_windows.fetchall()) if c_windows else {},
        presence=presence,
        holders=holders,
    )


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


@dataclass(frozen=True, slots=True)
class Reach:
    """What a send job checks about its recipient at send time.

    Attributes:
        allowed: an active human who may read the thread now (no thread: an
            active human).
        space_id, channel_id: the thread's current place (it may have moved).
        read_position: ``max(last_read_seq, unread_floor_seq)``; 0 without a thread.
    """

    allowed: bool
    space_id: str | None
    channel_id: str | None
    read_position: int


def reach_now(
    conn: Conn, pairs: Collection[tuple[str, str | None]]
) -> dict[tuple[str, str | None], Reach]:
    """:class:`Reach` for every (recipient, thread or ``None``) pair, in one query."""
    if not pairs:
        return {}
    keys = list(pairs)
    rows = conn.execute(
        "SELECT k.u, k.t,"
        " coalesce(p.kind = 'human' AND p.active, false) AND (k.t IS NULL OR EXISTS ("
        "   SELECT 1 FROM bothy.members m WHERE m.user_id = k.u"
        "   AND m.scope_id IN (t.thread_id, t.channel_id, t.space_id))),"
        " t.space_id, t.channel_id,"
        " greatest(coalesce(r.last_read_seq, 0), coalesce(t.unread_floor_seq, 0))"
        " FROM unnest(%s::text[], %s::text[]) AS k(u, t)"
        " LEFT JOIN bothy.users p ON p.user_id = k.u"
        " LEFT JOIN bothy.threads t ON t.thread_id = k.t"
        " LEFT JOIN bothy.read_states r ON r.user_id = k.u AND r.thread_id = k.t",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(r[0], r[1]): Reach(bool(r[2]), r[3], r[4], int(r[5])) for r in rows}
