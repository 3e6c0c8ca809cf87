"""Bulk reads of the projection that decisions need (notify's adapter to the store).

Each function takes a set of keys and answers with one query, so a round
decides a whole batch of events with a handful of statements however many
recipients they have.

With ``cluster.mode = "multi"`` presence is one of these facts too
(:class:`SharedPresence`): the union of the presence every live node published
to ``bothy.presence``, read in the same pipeline as the rest of a group.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain, repeat
from typing import Any

import orjson

from bothy_notify.config import Level
from bothy_notify.kernel.presence import PresenceEntry, PresenceView
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify.domain.model import Device, Window
from bothy_notify.notify.domain.quiet import QuietHours, quiet_from_doc
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
    quiet_hours: QuietHours | None = None
    """Their quiet hours (``None``: never set, so never quiet)."""


UNKNOWN_PERSON = Person(human=False, active=False, categories_off=frozenset())
"""A person the projection has never heard of receives nothing."""


# Lists of keys travel as one JSON array (orjson) that the server unpacks: psycopg builds
# a text[] parameter element by element in Python, which for the thousands of
# (recipient, thread) pairs of a group cost more than the rest of the read. Every key
# list is free of duplicates.
#
# Every read reaches each table by its key, at any key count and table size, in a
# form that leaves the planner no other choice (docs/performance.md, "decide at
# scale"; tests/notify/test_read_plans.py). It cannot count the keys of a JSON array: it
# guesses 100 rows for the unpacked list and 10 elements for an array built from
# it. Joined to the list as a plain table, a table of a few thousand rows (threads),
# or one with many rows per key (follows), was scanned whole for every group, one
# key or 30,000. A true count does not help: given an unnested text[] it scans
# people and windows at 500 keys (pricing each probe as a disk read), and after a
# few executions a prepared statement plans for 100 rows anyway. So:
# - one key column: ``column = ANY(_KEY_ARRAY)``, an index scan with one descent
#   per key (with 10 elements guessed, the cheapest plan for any table but a few
#   pages);
# - a read per key that must stay one (pairs, many rows per key, the row joined to
#   a fact: preferences, devices): a LATERAL sub-select per key, fenced with OFFSET
#   0 (or an aggregate), so that it is never flattened into a join the planner
#   could make a hash of a whole table.
_KEYS = "json_array_elements_text(%s::json)"
_KEY_ARRAY = f"ARRAY(SELECT {_KEYS})"
_PAIR_KEYS = f"ROWS FROM ({_KEYS}, {_KEYS})"
_THREADS = (
    "SELECT t.thread_id, t.space_id, t.channel_id, t.last_message_seq, t.unread_floor_seq"
    f" FROM bothy.threads t WHERE t.thread_id = ANY({_KEY_ARRAY})"
)
# One JSON text for all of a group's follow levels: {thread: {user: level}}, one
# index range per thread (a popular thread has thousands of rows: no sort, no scan).
_FOLLOWS = (
    "SELECT coalesce(json_object_agg(k.id, f.levels), '{}')::text"
    f" FROM {_KEYS} AS k(id) CROSS JOIN LATERAL ("
    "  SELECT json_object_agg(f.user_id, f.level) AS levels FROM bothy.follows f"
    "  WHERE f.thread_id = k.id) f"
    " WHERE f.levels IS NOT NULL"
)
# The stored levels a group of messages needs when its candidates are the followers
# at level `all` and the mentioned (no `notify.default_level = "all"`, no group
# mention): per thread its `all` followers, one index-only range of the partial index
# `follows_all` (not the thousands of `mentions` follows of a popular thread), and
# each mentioned person's level by its key. The keys: {thread: [mentioned, ...]}.
_CANDIDATE_FOLLOWS = (
    "SELECT coalesce(json_object_agg(k.id, f.levels), '{}')::text"
    " FROM json_each(%s::json) AS k(id, mentioned) CROSS JOIN LATERAL ("
    "  SELECT json_object_agg(f.user_id, f.level) AS levels FROM ("
    "   SELECT f.user_id, f.level FROM bothy.follows f"
    "   WHERE f.thread_id = k.id AND f.level = 'all'"
    "   UNION ALL SELECT f.user_id, f.level"
    "   FROM json_array_elements_text(k.mentioned) AS m(id) CROSS JOIN LATERAL ("
    "    SELECT f.user_id, f.level FROM bothy.follows f"
    "    WHERE f.thread_id = k.id AND f.user_id = m.id OFFSET 0) f) f) f"
    " WHERE f.levels IS NOT NULL"
)
# The people with read access to each thread (a membership names the thread, its
# channel or its space), as one JSON text {thread: [user, ...]}: per thread by its
# key, each scope's members by the members key (a space has thousands: no scan), in
# a fenced LATERAL per scope.
# Read for a group mention's audience, and for candidates when notify.default_level
# is "all". The aggregate fences each thread's read from being flattened into a join.
_THREAD_MEMBERS = (
    "SELECT coalesce(json_object_agg(k.id, m.users), '{}')::text"
    f" FROM {_KEYS} AS k(id) CROSS JOIN LATERAL ("
    "  SELECT json_agg(DISTINCT m.user_id) AS users FROM bothy.threads t"
    "  CROSS JOIN unnest(ARRAY[t.thread_id, t.channel_id, t.space_id]) AS s(id)"
    "  CROSS JOIN LATERAL (SELECT m.user_id FROM bothy.members m"
    "   WHERE m.scope_id = s.id OFFSET 0) m"
    "  WHERE t.thread_id = k.id) m"
    " WHERE m.users IS NOT NULL"
)
# What a group needs of each of its people, as one JSON text, {user: [human, active,
# categories off, quiet hours, scopes, devices]}, decoded by orjson in one call
# (psycopg's rows and Python's loops over them cost more than the reads did). One row
# per person of the group who has a `users` row (anyone else is UNKNOWN_PERSON); each
# fact a scalar sub-select by the person's key (never flattened into a join):
# - categories off: the keys of `preferences.categories` set to JSON false;
# - quiet hours: the stored document's JSON text (a string, parsed once per text);
# - scopes, for read access: every scope (thread, channel, space) a membership of the
#   person names, read per person, never per scope (a space may have more members
#   than the group has people); a person may read a thread when one of them is one of
#   its scopes. Not narrowed to the group's scopes here: against the thousand scopes
#   of a burst's threads that filter cost more than the memberships themselves, and
#   the decision tests each thread's scopes against the person's anyway;
# - devices: [device, platform, registration] of each active registration of an
#   active device. A device without a row counts as active (its row may still be on
#   its way); (user_id, device_id) is a device's key.
_RECIPIENTS = (
    "SELECT coalesce(json_object_agg(u.user_id, json_build_array(u.kind = 'human', u.active,"
    "  (SELECT json_agg(c.key) FROM bothy.preferences p CROSS JOIN jsonb_each(p.categories) c"
    "   WHERE p.user_id = u.user_id AND c.value = 'false'::jsonb),"
    "  (SELECT q.doc::text FROM bothy.quiet_hours q WHERE q.user_id = u.user_id),"
    "  ARRAY(SELECT m.scope_id FROM bothy.members m WHERE m.user_id = u.user_id),"
    "  (SELECT json_agg(json_build_array(r.device_id, coalesce(d.platform, 'web'), r.id))"
    "   FROM bothy.push_registrations r LEFT JOIN LATERAL (SELECT d.platform, d.state"
    "    FROM bothy.devices d WHERE d.user_id = r.user_id AND d.device_id = r.device_id"
    "    OFFSET 0) d ON true"
    "   WHERE r.user_id = u.user_id AND r.invalidated_at IS NULL"
    "   AND coalesce(d.state, 'active') = 'active'))), '{}')::text"
    f" FROM bothy.users u WHERE u.user_id = ANY({_KEY_ARRAY})"
)
# The stored read positions of the group's (person, thread) pairs, as one JSON text
# {thread: {user: last_read_seq}}, each by its key. The keys: {thread: [user, ...]}.
_READS = (
    "SELECT coalesce(json_object_agg(k.id, r.seqs), '{}')::text"
    " FROM json_each(%s::json) AS k(id, users) CROSS JOIN LATERAL ("
    "  SELECT json_object_agg(r.user_id, r.last_read_seq) AS seqs"
    "  FROM json_array_elements_text(k.users) AS u(id) CROSS JOIN LATERAL ("
    "   SELECT r.user_id, r.last_read_seq FROM bothy.read_states r"
    "   WHERE r.user_id = u.id AND r.thread_id = k.id OFFSET 0) r) r"
    " WHERE r.seqs IS NOT NULL"
)
_WINDOWS = (
    "SELECT k.user_id, k.thread_id, w.opened_at, w.closes_at, w.count, w.first_seq,"
    " w.newest_seq, w.newest_message_id, w.mention"
    f" FROM {_PAIR_KEYS} AS k(user_id, thread_id) CROSS JOIN LATERAL ("
    "  SELECT * FROM bothy.hint_windows w"
    "  WHERE w.user_id = k.user_id AND w.thread_id = k.thread_id OFFSET 0) w"
)
# Rows of live nodes only; a device live on two nodes at once (it moved, and the
# older connection is not closed yet) counts once: its newest connection wins
# (live_seq, the order in which the cluster learnt of the connections).
# The presence table holds a row per live connection of the cluster (idle ones
# too), while a group asks for a few people: the fenced LATERAL (OFFSET 0) keeps
# one index probe per person. As a plain join the planner, which guesses 100 keys,
# hashes them against a scan of the whole table (a cost growing with the connections
# and with the table's dead rows, once per group; bench/cluster.py).
_PRESENCE = (
    "SELECT p.user_id, p.device_id, p.platform, p.focus, p.idle, p.node_id::text"
    f" FROM {_KEYS} AS k(id) CROSS JOIN LATERAL ("
    "  SELECT * FROM bothy.presence p WHERE p.user_id = k.id OFFSET 0) p"
    " JOIN bothy.nodes n ON n.node_id = p.node_id"
    " WHERE n.seen_at >= %s"
    " ORDER BY p.live_seq, p.updated_at, p.node_id"
)
_LEVELS = {level.value: level for level in Level}

Rows = list[tuple[Any, ...]]


def _threads(rows: Rows) -> dict[str, ThreadInfo]:
    return {r[0]: ThreadInfo.of(*r) for r in rows}


def _keys(values: Iterable[str]) -> str:
    """A JSON array of ``values`` without duplicates: a key list as one parameter (see
    ``_KEYS``)."""
    return orjson.dumps(list(dict.fromkeys(values))).decode()


def _follows(rows: Rows) -> dict[str, dict[str, Level]]:
    levels = _LEVELS
    out: dict[str, dict[str, Level]] = defaultdict(dict)
    for thread_id, by_user in orjson.loads(rows[0][0]).items():
        out[thread_id] = {user_id: levels[level] for user_id, level in by_user.items()}
    return out


@functools.lru_cache(maxsize=4096)
def hours_of(doc: str) -> QuietHours:
    """The quiet hours of a stored document's JSON text (parsed once per text)."""
    return quiet_from_doc(orjson.loads(doc))


@functools.lru_cache(maxsize=1024)
def _person(human: bool, active: bool, off: tuple[str, ...] | None, quiet: str | None) -> Person:
    """One shared :class:`Person` per distinct set of facts: most people of a group
    have the same few (a human, active, nothing switched off, no quiet hours)."""
    return Person(human, active, frozenset(off or ()), None if quiet is None else hours_of(quiet))


_PLAIN_PERSON = _person(True, True, None, None)

Recipients = tuple[dict[str, Person], dict[str, tuple[Device, ...]], dict[str, list[str]]]


def _recipients(text: str) -> Recipients:
    """The people, devices and scopes (only those with some) of a ``_RECIPIENTS`` answer."""
    people: dict[str, Person] = {}
    devices: dict[str, tuple[Device, ...]] = {}
    member_of: dict[str, list[str]] = {}
    person, plain = _person, _PLAIN_PERSON
    for user_id, (human, active, off, quiet, scopes, regs) in orjson.loads(text).items():
        if human and active and off is None and quiet is None:
            people[user_id] = plain  # the common case, without a call
        else:
            people[user_id] = person(human, active, None if off is None else tuple(off), quiet)
        if scopes:
            member_of[user_id] = scopes
        if regs is None:
            continue
        if len(regs) == 1:
            ((device_id, platform, reg_id),) = regs
            devices[user_id] = (Device(device_id, platform, (reg_id,)),)
        else:
            devices[user_id] = _devices_of(regs)
    return people, devices, member_of


def _devices_of(regs: list[list[str]]) -> tuple[Device, ...]:
    """A person's devices from their (device, platform, registration) triples, by
    device, each device's registrations in order."""
    per_device: dict[str, tuple[str, list[str]]] = {}
    for device_id, platform, reg_id in sorted(regs):
        per_device.setdefault(device_id, (platform, []))[1].append(reg_id)
    return tuple(Device(d, platform, tuple(ids)) for d, (platform, ids) in per_device.items())


def _one(cursor: Any) -> str:
    """The one text value of a JSON read's answer."""
    row = cursor.fetchone()
    assert row is not None
    text: str = row[0]
    return text


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
    return _threads(conn.execute(_THREADS, (_keys(thread_ids),)).fetchall())


def follow_rows(conn: Conn, thread_ids: Collection[str]) -> dict[str, dict[str, Level]]:
    """Every stored follow level of these threads: thread -> user -> level."""
    return send_follow_rows(conn, thread_ids)()


def send_follow_rows(
    conn: Conn, thread_ids: Collection[str]
) -> Callable[[], dict[str, dict[str, Level]]]:
    """:func:`follow_rows` in two steps: send the read now, and read its answer when
    the returned function is called. Inside a pipeline the database runs the read
    while the caller goes on with other work in between."""
    if not thread_ids:
        return lambda: defaultdict(dict)
    cursor = conn.execute(_FOLLOWS, (_keys(thread_ids),))
    return lambda: _follows(cursor.fetchall())


def send_candidate_follows(
    conn: Conn, mentioned: Mapping[str, Collection[str]]
) -> Callable[[], dict[str, dict[str, Level]]]:
    """The stored levels that decide a message whose candidates are its thread's
    followers at level ``all`` and the mentioned: for each thread of ``mentioned``
    (thread -> the people its messages mention), its followers at ``all`` and the
    stored level of each mentioned person who has one (thread -> user -> level).
    Any other stored level of the thread is left out: a caller that needs every
    follow (``notify.default_level = "all"``, a group mention) reads
    :func:`send_follow_rows`. Sent now, answered when the returned function is called
    (as :func:`send_follow_rows`)."""
    if not mentioned:
        return lambda: defaultdict(dict)
    keys = orjson.dumps({t: list(dict.fromkeys(us)) for t, us in mentioned.items()}).decode()
    cursor = conn.execute(_CANDIDATE_FOLLOWS, (keys,))
    return lambda: _follows(cursor.fetchall())


def thread_members(conn: Conn, thread_ids: Collection[str]) -> dict[str, list[str]]:
    """thread -> the people with read access to it now (a membership names the thread,
    its channel or its space); a thread without any is absent."""
    return send_thread_members(conn, thread_ids)()


def send_thread_members(
    conn: Conn, thread_ids: Collection[str]
) -> Callable[[], dict[str, list[str]]]:
    """:func:`thread_members` in two steps, as :func:`send_follow_rows`."""
    if not thread_ids:
        return dict
    cursor = conn.execute(_THREAD_MEMBERS, (_keys(thread_ids),))

    def answer() -> dict[str, list[str]]:
        rows = cursor.fetchall()
        found: dict[str, list[str]] = orjson.loads(rows[0][0])
        return found

    return answer


def shared_presence(
    conn: Conn, users: Collection[str], since: datetime
) -> dict[str, tuple[PresenceEntry, ...]]:
    """The cluster's presence of ``users`` (:class:`SharedPresence`) from nodes live
    since ``since``, outside a group read: the same statement and rules as
    :func:`load_group`'s."""
    if not users:
        return {}
    return _presence(conn.execute(_PRESENCE, (_keys(users), since)).fetchall())[0]


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """Everything a group of hints needs, read at one point of the round.

    Attributes:
        infos: thread -> its place and sequences.
        follows: thread -> user -> stored follow level.
        member_of: user -> the scopes their memberships name (see
            :meth:`may_read`); absent: none.
        reads: thread -> user -> stored ``last_read_seq``.
        people: user -> kind, active, categories switched off.
        devices: user -> active devices with active registrations.
        windows: (user, thread) -> stored coalescing window.
        presence: user -> the live entries of the shared presence (read only
            with ``presence_since``; empty otherwise).
        holders: user -> device -> the node holding that live connection.
    """

    infos: dict[str, ThreadInfo]
    follows: dict[str, dict[str, Level]]
    member_of: dict[str, list[str]]
    reads: dict[str, dict[str, int]]
    people: dict[str, Person]
    devices: dict[str, tuple[Device, ...]]
    windows: dict[tuple[str, str], Window]
    presence: dict[str, tuple[PresenceEntry, ...]] = field(default_factory=dict)
    holders: dict[str, dict[str, str]] = field(default_factory=dict)

    def may_read(self, user_id: str, info: ThreadInfo) -> bool:
        """Whether ``user_id`` has read access to the thread of ``info`` now: a
        membership names the thread, its channel or its space."""
        scopes = self.member_of.get(user_id)
        return scopes is not None and not frozenset(info.scopes).isdisjoint(scopes)


def load_group(
    conn: Conn,
    *,
    users: Collection[str],
    pairs: Collection[tuple[str, str]] | Mapping[str, Collection[str]],
    follows: dict[str, dict[str, Level]] | None,
    with_windows: bool,
    presence_since: datetime | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> GroupFacts:
    """Read a group's facts with every query in one pipeline (one round trip).

    ``pairs`` are the (recipient, thread) pairs of hints with a thread, or per
    thread its recipients (what the round passes: no tuple per pair);
    ``follows`` may be passed when the caller read them already. With
    ``presence_since`` the shared presence of nodes live since then is read
    too (:class:`SharedPresence`). ``meanwhile`` is called once the reads are
    sent and before their answers are read: work that needs no facts, done while
    the database runs them. It must not use the connection.
    """
    user_keys = _keys(users)
    if isinstance(pairs, Mapping):
        by_thread = {t: list(dict.fromkeys(us)) for t, us in pairs.items() if us}
    else:
        by_thread = {}
        for user_id, thread_id in dict.fromkeys(pairs):
            by_thread.setdefault(thread_id, []).append(user_id)
    thread_list = sorted(by_thread)
    thread_keys = _keys(thread_list)
    with conn.pipeline():
        # The largest read first: its answer is decoded (below) while the database
        # runs the others.
        c_recipients = conn.execute(_RECIPIENTS, (user_keys,))
        c_threads = conn.execute(_THREADS, (thread_keys,)) if thread_list else None
        c_follows = (
            conn.execute(_FOLLOWS, (thread_keys,)) if thread_list and follows is None else None
        )
        c_reads = conn.execute(_READS, (orjson.dumps(by_thread).decode(),)) if thread_list else None
        c_windows = None
        if thread_list and with_windows:
            # Two arrays of the pairs, read in step (``_PAIR_KEYS``).
            pair_users = orjson.dumps(list(chain.from_iterable(by_thread.values()))).decode()
            pair_threads = orjson.dumps(
                list(chain.from_iterable(repeat(t, len(us)) for t, us in by_thread.items()))
            ).decode()
            c_windows = conn.execute(_WINDOWS, (pair_users, pair_threads))
        c_presence = (
            conn.execute(_PRESENCE, (user_keys, presence_since))
            if presence_since is not None
            else None
        )
        if meanwhile is not None:
            meanwhile()
        people, devices, member_of = _recipients(_one(c_recipients))
    presence, holders = _presence(c_presence.fetchall()) if c_presence else ({}, {})
    return GroupFacts(
        infos=_threads(c_threads.fetchall()) if c_threads else {},
        follows=follows
        if follows is not None
        else (_follows(c_follows.fetchall()) if c_follows else defaultdict(dict)),
        member_of=member_of,
        reads=orjson.loads(_one(c_reads)) if c_reads else {},
        people=people,
        devices=devices,
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


@fast_init
@dataclass(frozen=True, slots=True)
class Reach:
    """What a send job checks about its recipient at send time.

    Attributes:
        allowed: an active human who may read the thread now (no thread: an
            active human).
        space_id, channel_id: the thread's current place (it may have moved).
        read_position: ``max(last_read_seq, unread_floor_seq)``; 0 without a thread.
        deletions: the thread had a message deleted recently (its ``deleted_at``):
            only then does a send ask whether its own message was
            (:func:`bothy_notify.store.deletions.deleted_among`), so a send in a
            thread without deletions reads nothing more.
    """

    allowed: bool
    space_id: str | None
    channel_id: str | None
    read_position: int
    deletions: bool = False


def reach_now(
    conn: Conn, pairs: Collection[tuple[str, str | None]]
) -> dict[tuple[str, str | None], Reach]:
    """:class:`Reach` for every (recipient, thread or ``None``) pair, in one query."""
    if not pairs:
        return {}
    keys = list(pairs)
    # The pairs as two JSON arrays (a pair without a thread: null), each fact read by
    # its key per pair (see _KEYS: with their true count the planner hashed a
    # thousand pairs against whole scans of the people and the threads).
    rows = conn.execute(
        "SELECT k.u, k.t,"
        " coalesce(p.kind = 'human' AND p.active, false) AND (k.t IS NULL OR EXISTS ("
        "   SELECT 1 FROM bothy.members m WHERE m.user_id = k.u"
        "   AND m.scope_id IN (t.thread_id, t.channel_id, t.space_id))),"
        " t.space_id, t.channel_id,"
        " greatest(coalesce(r.last_read_seq, 0), coalesce(t.unread_floor_seq, 0)),"
        " t.deleted_at IS NOT NULL"
        f" FROM {_PAIR_KEYS} AS k(u, t)"
        " LEFT JOIN LATERAL (SELECT p.kind, p.active FROM bothy.users p"
        "  WHERE p.user_id = k.u OFFSET 0) p ON true"
        " LEFT JOIN LATERAL (SELECT t.thread_id, t.channel_id, t.space_id, t.unread_floor_seq,"
        "  t.deleted_at FROM bothy.threads t WHERE t.thread_id = k.t OFFSET 0) t ON true"
        " LEFT JOIN LATERAL (SELECT r.last_read_seq FROM bothy.read_states r"
        "  WHERE r.user_id = k.u AND r.thread_id = k.t OFFSET 0) r ON true",
        (orjson.dumps([k[0] for k in keys]).decode(), orjson.dumps([k[1] for k in keys]).decode()),
    ).fetchall()
    return {(r[0], r[1]): Reach(bool(r[2]), r[3], r[4], int(r[5]), r[6] is True) for r in rows}
