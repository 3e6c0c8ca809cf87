"""One consumer round's work on one batch: projections and decisions in log order.

:class:`RoundPlanner` runs in a worker thread inside the round's transaction.
Consecutive ``message.created`` events are decided as one group with a handful
of bulk reads; every other event is a barrier: the pending group is decided
first, then the event's projection applies, then its own hint (if any) is
decided, so each decision sees the facts of its place in the log.

A ``message.created`` with ``mention_groups`` mentions the group's audience
(:meth:`RoundPlanner._group_mentions`); ``message.edited`` is a barrier that
decides one ``mention`` hint for the newly mentioned (once per message and
person, through the hint idempotency); ``message.deleted`` is a barrier that
records the deletion, queues the phones' ``removed`` pushes and tells the
desktops (:meth:`RoundPlanner._message_deleted`).

Nothing here sends anything: decisions become job specs, inserted with the
cursor in the same transaction (the desktops' ``NOTIFY`` is delivered at its
commit too).

The kind catalogue is refreshed once per round (not per hint) and its version
is fixed on every hint the round decides (``Hint.mv``), so every copy of one
notification carries the same ``mv`` whenever it is sent.

When something raises, :attr:`RoundPlanner.in_progress` says which events of
the batch were being applied or decided (one barrier event, or a group of
messages), so the round can set the culprit aside without trying every event.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from bothy_notify.config import BUILTIN_CATEGORIES, Config, Level
from bothy_notify.kernel.clock import to_unix_micros
from bothy_notify.kernel.presence import PresenceEntry
from bothy_notify.kernel.results import SkipReason
from bothy_notify.notify import facts
from bothy_notify.notify.catalogue import CatalogueSource
from bothy_notify.notify.domain import (
    Decision,
    Delivery,
    Fold,
    Hint,
    HintRules,
    Policy,
    RecipientFacts,
    Skip,
    Window,
)
from bothy_notify.notify.domain.quiet import quiet_at
from bothy_notify.notify.facts import PresenceSource, SharedPresence
from bothy_notify.notify.hints import (
    HintRequest,
    admin_hint,
    dedupe_key,
    edit_hint,
    edit_key,
    message_hint,
    requested_hint,
    security_hint,
)
from bothy_notify.notify.jobs.args import FLUSH, FlushArgs
from bothy_notify.notify.routes import HintJobs, LiveRoutes
from bothy_notify.store import deletions, idempotency, marks
from bothy_notify.store.db import Conn
from bothy_notify.store.events import Event
from bothy_notify.store.jobs import JobSpec, JobWriter
from bothy_notify.store.marks import clearing_of
from bothy_notify.store.projections import (
    PROJECTIONS,
    mark_read,
    record_messages,
    upsert_device,
)
from bothy_notify.topics.dispatch import ENVELOPE_PUBLISHED, TopicsOutcome
from bothy_notify.topics.dispatch import dispatch as dispatch_envelopes

log = logging.getLogger("bothy.notify.round")

FLUSH_MAX_ATTEMPTS = 5
"""A flush only reads and inserts jobs; five tries ride out a database hiccup."""


class UnknownEventType(KeyError):
    """The event's type has no projection in this version of the daemon (a newer
    node's migration added it). The round dead-letters such an event; a replay
    after an upgrade applies it."""


def projection_of(event_type: str) -> Callable[[Conn, Mapping[str, Any]], object]:
    """The projection of ``event_type``; raises :class:`UnknownEventType`."""
    try:
        return PROJECTIONS[event_type]
    except KeyError:
        raise UnknownEventType("an event type this version does not know") from None


@dataclass
class RoundOutcome:
    """What a round decided, applied to metrics only after its commit."""

    jobs: int = 0
    skips: Counter[SkipReason] = field(default_factory=Counter)
    hints: Counter[str] = field(default_factory=Counter)
    folded: int = 0
    deduplicated: int = 0
    group_mentions_refused: int = 0
    registrations_invalidated: int = 0
    topics: TopicsOutcome = field(default_factory=TopicsOutcome)


def policy_of(config: Config) -> Policy:
    return Policy(
        mobile_delay=config.notify.mobile_delay_when_desktop_active,
        coalesce_window=config.notify.coalesce_window,
    )


class Decider:
    """Loads facts in bulk and decides hints for many recipients (shared by the round
    and the flush job).

    ``mv`` is the kind catalogue's version at this decision; it is fixed on every
    hint decided here that does not carry one already.
    ``presence`` is this process's presence view, or :class:`SharedPresence`
    (a cluster): then presence is read with the group's other facts, and gateway
    jobs are targeted at the nodes holding the connections.
    """

    def __init__(
        self,
        conn: Conn,
        *,
        now: datetime,
        config: Config,
        presence: PresenceSource,
        live: LiveRoutes,
        outcome: RoundOutcome,
        writer: JobWriter,
        mv: str | None = None,
    ) -> None:
        self.conn = conn
        self.writer = writer
        self.mv = mv
        self.now = now
        self.config = config
        self.presence = presence
        self.live = live
        self.outcome = outcome
        self.policy = policy_of(config)
        self.categories = frozenset(BUILTIN_CATEGORIES) | frozenset(config.notify.categories)
        self._encoded: dict[str, bytes] = {}
        """JSON-encoded IDs and kinds of this decider's jobs (:class:`HintJobs`)."""

    def live_presence(self, users: Collection[str]) -> dict[str, tuple[PresenceEntry, ...]]:
        """The presence of those of ``users`` with a live connection now: this
        process's view, or the cluster's shared presence (one statement)."""
        if isinstance(self.presence, SharedPresence):
            return facts.shared_presence(self.conn, users, self.presence.since(self.now))
        return dict(self.presence.entries(users))

    def decide_group(
        self,
        items: Sequence[tuple[Hint, Sequence[str], datetime]],
        *,
        windows_on: bool = True,
        follows: dict[str, dict[str, Level]] | None = None,
    ) -> None:
        """Decide each (hint, recipients, appended_at) in order, with facts read once.

        ``follows`` are the stored follow levels of the items' threads when the
        caller has read them already.
        """
        users = {u for _h, recipients, _a in items for u in recipients}
        if not users:
            return
        pairs: dict[str, set[str]] = {}  # thread -> its recipients in this group
        for h, recipients, _a in items:
            if h.thread_id:
                pairs.setdefault(h.thread_id, set()).update(recipients)
        shared = self.presence if isinstance(self.presence, SharedPresence) else None
        prepared: list[tuple[Hint, HintRules, HintJobs, Sequence[str]]] = []
        local: list[Mapping[str, tuple[PresenceEntry, ...]]] = []

        def prepare() -> None:
            """What needs no facts, done while the database reads them."""
            for given, recipients, appended_at in items:
                stamp = given.mv is None and self.mv is not None
                hint = replace(given, mv=self.mv) if stamp else given
                if hint.category not in self.categories:
                    log.warning(
                        "hint category is not configured; skipped", extra={"kind": hint.kind}
                    )
                    self.outcome.skips[SkipReason.PREFERENCE] += len(recipients)
                    continue
                jobs = HintJobs(
                    hint,
                    self.live,
                    self.writer,
                    now=self.now,
                    appended_at=appended_at,
                    push_max_attempts=self.config.push.max_attempts,
                    encoded=self._encoded,
                )
                prepared.append((hint, HintRules.of(hint, self.policy, self.now), jobs, recipients))
            if shared is None:
                assert not isinstance(self.presence, SharedPresence)
                local.append(self.presence.entries(users))

        group = facts.load_group(
            self.conn,
            users=users,
            pairs=pairs,
            follows=follows,
            with_windows=windows_on and self.policy.coalesce_window.total_seconds() > 0,
            presence_since=shared.since(self.now) if shared is not None else None,
            meanwhile=prepare,
        )
        infos, reads, member_of = group.infos, group.reads, group.member_of
        windows, follows = group.windows, group.follows
        holders: dict[str, dict[str, str]] | None = None
        presence: Mapping[str, tuple[PresenceEntry, ...]]
        if shared is not None:
            presence, holders = group.presence, group.holders
        else:
            (presence,) = local
        # What a recipient brings to every hint of the group, looked up once.
        people, devices = group.people, group.devices
        unknown, nothing = facts.UNKNOWN_PERSON, ()
        per_user = {
            u: (people.get(u, unknown), devices.get(u, nothing), presence.get(u, nothing))
            for u in users
        }
        hushed = {
            u: quiet_at(p.quiet_hours, self.now)
            for u, (p, _d, _e) in per_user.items()
            if p.quiet_hours is not None
        }
        changed: dict[tuple[str, str], Window] = {}
        default_level = self.config.notify.default_level
        no_follows: dict[str, Level] = {}
        no_reads: dict[str, int] = {}

        # Jobs stream into COPY while deciding: the database ingests on its own core.
        with self.writer.stream():
            for hint, rules, jobs, recipients in prepared:
                thread_id = hint.thread_id
                info = infos.get(thread_id) if thread_id else None
                levels = follows.get(thread_id, no_follows) if thread_id else no_follows
                thread_reads = reads.get(thread_id, no_reads) if thread_id else no_reads
                floor = info.unread_floor_seq if info is not None else 0
                thread_scopes = frozenset(info.scopes) if info is not None else frozenset()
                for user in recipients:
                    person, user_devices, user_presence = per_user[user]
                    if thread_id is None:
                        access, level, read_pos = True, Level.ALL, 0
                    elif info is None:
                        access, level, read_pos = False, default_level, 0
                    else:
                        # group.may_read, inlined: this loop runs once per recipient
                        scopes = member_of.get(user)
                        access = scopes is not None and not thread_scopes.isdisjoint(scopes)
                        level = levels.get(user, default_level)
                        read_pos = max(thread_reads.get(user, 0), floor)
                    recipient = RecipientFacts(
                        user,
                        person.human,
                        person.active,
                        access,
                        level,
                        person.categories_off,
                        read_pos,
                        user_devices,
                        user_presence,
                        hushed.get(user, False),
                    )
                    key = (user, thread_id or "")
                    decision = rules.decide(recipient, windows.get(key) if windows else None)
                    where = holders.get(user) if holders is not None else None
                    self._apply(hint, decision, jobs, key, windows, changed, where)
        facts.save_windows(self.conn, ((u, t, w) for (u, t), w in changed.items()))

    def _apply(
        self,
        hint: Hint,
        decision: Decision,
        jobs: HintJobs,
        key: tuple[str, str],
        windows: dict[tuple[str, str], Window],
        changed: dict[tuple[str, str], Window],
        holders: dict[str, str] | None,
    ) -> None:
        out = self.outcome
        if isinstance(decision, Delivery):  # the common case first
            out.hints[_kind_class(decision.kind)] += 1
            out.jobs += jobs.add(decision, holders)
            if decision.opens is not None and hint.thread_id is not None:
                window = decision.opens
                windows[key] = changed[key] = window
                opened = to_unix_micros(window.opened_at)
                out.jobs += 1
                self.writer.add(
                    JobSpec(
                        FLUSH,
                        FlushArgs(decision.user_id, hint.thread_id, opened).to_args(),
                        window.closes_at,
                        FLUSH_MAX_ATTEMPTS,
                        unique_key=f"flush:{decision.user_id}:{hint.thread_id}:{opened}",
                    )
                )
        elif isinstance(decision, Skip):
            out.skips[decision.reason] += 1
        elif isinstance(decision, Fold):
            out.folded += 1
            windows[key] = changed[key] = decision.window


def _kind_class(kind: str) -> str:
    """Metric label for a kind: built-in kinds by name, app kinds as ``app``."""
    return kind if ":" not in kind else "app"


class RoundPlanner:
    """Projections and decisions for one batch of events, in log order.

    ``catalogue`` is refreshed once here (blocking: the round's worker thread);
    its version goes on every hint of the batch.
    """

    def __init__(
        self,
        conn: Conn,
        *,
        now: datetime,
        config: Config,
        presence: PresenceSource,
        live: LiveRoutes,
        catalogue: CatalogueSource | None = None,
    ) -> None:
        self.conn = conn
        self.outcome = RoundOutcome()
        self.writer = JobWriter(conn, now)
        self.decider = Decider(
            conn,
            now=now,
            config=config,
            presence=presence,
            live=live,
            outcome=self.outcome,
            writer=self.writer,
            mv=catalogue.refresh().version if catalogue is not None else None,
        )
        self.config = config
        self._messages: list[Event] = []
        self._envelopes: list[int] = []
        self._envelopes_span: tuple[int, int] | None = None
        self._messages_from = 0
        self.in_progress: tuple[int, int] | None = None
        """``[start, end)`` indices into the batch being applied or decided right now;
        after :meth:`feed` returns, ``None``."""

    def feed(self, events: Sequence[Event]) -> None:
        for index, event in enumerate(events):
            if event.type == "message.created":
                if not self._messages:
                    self._messages_from = index
                self._messages.append(event)
            elif event.type == ENVELOPE_PUBLISHED:
                # Topic mode reads no projection and writes none: its envelopes go
                # to the topics dispatcher together, whatever lies between them.
                self._envelopes.append(event.seq)
                first = self._envelopes_span[0] if self._envelopes_span else index
                self._envelopes_span = (first, index + 1)
            else:
                self._decide_messages()
                self.in_progress = (index, index + 1)
                self._apply(event)
        self._decide_messages()
        self._dispatch_envelopes()
        self.in_progress = None

    def _dispatch_envelopes(self) -> None:
        if not self._envelopes:
            return
        seqs, self._envelopes = self._envelopes, []
        self.in_progress = self._envelopes_span  # from the first envelope to the last
        self._envelopes_span = None
        self.outcome.jobs += dispatch_envelopes(
            self.conn,
            seqs,
            now=self.decider.now,
            max_attempts=self.config.push.max_attempts,
            outcome=self.outcome.topics,
        )

    def _apply(self, event: Event) -> None:
        p = event.payload
        request: HintRequest | None = None
        if event.type == "device.upserted":
            change = upsert_device(self.conn, p)
            self.outcome.registrations_invalidated += change.invalidated
            if p["state"] == "pending" and change.before != "pending":
                request = security_hint(p)
        elif event.type == "thread.read":
            mark_read(self.conn, p, clearing_of(self.config.push, self.decider.now))
        elif event.type == "message.edited":
            request = self._first_time_only(edit_hint(p, self.decider.mv), edit_key(p))
        elif event.type == "message.deleted":
            self._message_deleted(p)
        else:
            projection_of(event.type)(self.conn, p)
            if event.type == "access.expiring":
                request = admin_hint(p)
            elif event.type == "hint.requested":
                request = requested_hint(p)
                if request.hint.category not in self.config.notify.categories:
                    # The outbox path has no HTTP check in front of it.
                    log.warning(
                        "app hint category is not in notify.categories; skipped",
                        extra={"kind": request.hint.kind},
                    )
                    self.outcome.skips[SkipReason.PREFERENCE] += len(request.recipients)
                    return
                request = self._first_time_only(request, dedupe_key(request))
        if request is not None and request.recipients:
            self.decider.decide_group([(request.hint, request.recipients, event.occurred_at)])

    def finish(self) -> int:
        """Insert the remaining jobs; returns how many are new. Call once, before commit."""
        return self.writer.finish()

    def _first_time_only(self, request: HintRequest, key: str) -> HintRequest:
        """Drop recipients who already had the hint of ``key`` within
        ``notify.idempotency_window``.

        The record commits with the round, so a producer that retries the same
        request (same key, or same kind and target without a key) gets one hint,
        and an edited message's newly mentioned person one however often it is
        edited. A zero window turns deduplication off and records nothing.
        """
        if not request.recipients or self.config.notify.idempotency_window <= timedelta(0):
            return request
        fresh = idempotency.claim(
            self.conn,
            key,
            request.recipients,
            now=self.decider.now,
            window=self.config.notify.idempotency_window,
        )
        kept = tuple(r for r in request.recipients if r in fresh)
        self.outcome.deduplicated += len(request.recipients) - len(kept)
        return replace(request, recipients=kept)

    def _decide_messages(self) -> None:
        if not self._messages:
            return
        events, self._messages = self._messages, []
        self.in_progress = (self._messages_from, self._messages_from + len(events))
        thread_ids = {e.payload["thread_id"] for e in events}
        default_all = self.config.notify.default_level is Level.ALL
        # Who may read a thread: its candidates with default_level "all", a group
        # mention's audience. Read per thread by key, like the follows.
        wanted = (
            thread_ids
            if default_all
            else {e.payload["thread_id"] for e in events if e.payload.get("mention_groups")}
        )
        # Those threads need every stored level (who stored none, who stored `none`);
        # the others only their followers at `all` and the mentioned people's levels.
        mentioned: dict[str, set[str]] = {}
        for e in events:
            thread_id = e.payload["thread_id"]
            if thread_id not in wanted:
                mentioned.setdefault(thread_id, set()).update(e.payload.get("mentions") or ())
        with self.conn.pipeline():  # one round trip for the four
            record_messages(
                self.conn, [(e.payload["thread_id"], int(e.payload["thread_seq"])) for e in events]
            )
            read_all = facts.send_follow_rows(self.conn, wanted)
            read_candidates = facts.send_candidate_follows(self.conn, mentioned)
            read_members = facts.send_thread_members(self.conn, wanted)
            # The database records and reads meanwhile.
            hints = [message_hint(e.payload, self.decider.mv) for e in events]
            follows = read_candidates()
            follows.update(read_all())
            members = read_members()
        items: list[tuple[Hint, Sequence[str], datetime]] = []
        nobody: list[str] = []
        for event, written in zip(events, hints, strict=True):
            assert written.thread_id is not None
            stored = follows.get(written.thread_id, {})
            readers = members.get(written.thread_id, nobody)
            hint = written
            groups = event.payload.get("mention_groups")
            if groups:
                added = self._group_mentions(written, groups, stored, readers)
                if added:
                    hint = replace(written, mentions=written.mentions | added)
            candidates = self._candidates(
                hint.mentions, hint.actor_id, stored, readers if default_all else nobody
            )
            items.append((hint, sorted(candidates), event.occurred_at))
        self.decider.decide_group(items, follows=follows)

    @staticmethod
    def _candidates(
        mentions: Collection[str],
        author: str | None,
        stored: Mapping[str, Level],
        readers: Collection[str],
    ) -> set[str]:
        """A message's candidates (SPEC section 5): followers at level ``all``, the
        mentioned, and with ``notify.default_level = "all"`` the ``readers`` who
        stored no level; never the author."""
        candidates = {u for u, level in stored.items() if level is Level.ALL}
        candidates.update(mentions)
        candidates.update(u for u in readers if u not in stored)
        candidates.discard(author or "")
        return candidates

    def _group_mentions(
        self,
        hint: Hint,
        groups: Collection[str],
        stored: Mapping[str, Level],
        readers: Collection[str],
    ) -> frozenset[str]:
        """The people a message's ``mention_groups`` mention: for ``all`` every person
        with read access whose level is not ``none`` (never the author); for
        ``here`` those of them with a live connection that is not idle now. A
        group whose audience is larger than ``notify.group_mention_limit`` adds
        nobody and is counted (``bothy_group_mentions_refused_total``)."""
        default = self.config.notify.default_level
        limit = self.config.notify.group_mention_limit
        audience = [
            u for u in readers if u != hint.actor_id and stored.get(u, default) is not Level.NONE
        ]
        if "all" in groups:
            if len(audience) <= limit:
                return frozenset(audience)
            self.outcome.group_mentions_refused += 1
        if "here" in groups:
            here = [
                u
                for u, entries in self.decider.live_presence(audience).items()
                if any(not entry.idle for entry in entries)
            ]
            if len(here) <= limit:
                return frozenset(here)
            self.outcome.group_mentions_refused += 1
        return frozenset()

    def _message_deleted(self, p: Mapping[str, Any]) -> None:
        """``message.deleted``: record it (its pending sends are skipped ``deleted``
        when they run, and ``last_seq`` moves the thread's last message back), queue
        the ``removed`` pushes of the phones pushed for the thread, and tell the
        live connections of the message's candidates (``notification.removed``)."""
        conn, now = self.conn, self.decider.now
        thread_id = p["thread_id"]
        place = deletions.record(conn, p, now)
        clearing = clearing_of(self.config.push, now)
        if clearing is not None:
            self.outcome.jobs += marks.queue_removals(conn, thread_id, clearing)
        stored = facts.follow_rows(conn, [thread_id]).get(thread_id, {})
        readers: Collection[str] = ()
        if self.config.notify.default_level is Level.ALL:
            readers = facts.thread_members(conn, [thread_id]).get(thread_id, [])
        default = self.config.notify.default_level
        mentioned = [u for u in p.get("mentions") or () if stored.get(u, default) is not Level.NONE]
        candidates = self._candidates(mentioned, p["author_id"], stored, readers)
        deletions.tell_removed(
            conn, thread_id, p["message_id"], place, self.decider.live_presence(candidates).keys()
        )
