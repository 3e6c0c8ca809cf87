"""The consumer round: the one place where hints arise.

Exactly one round runs at a time across all nodes. It holds a session
advisory lock on a dedicated connection and runs its transactions on that same
connection, so losing the connection loses the lock and the round at once.
Idle nodes try the lock once per ``notify.poll_interval`` and take over on
their first try after the holder's connection ends.

Each round, in one transaction: read the next batch after the cursor, apply
projections and decide hints in log order (:class:`RoundPlanner`), insert the
jobs, advance the cursor. Jobs and cursor commit together; nothing leaves the
process before the commit. The round wakes on ``LISTEN bothy_events`` (sent by
``bothy.append_event``) and polls as a fallback. Its connection is a
:class:`~bothy_notify.store.listen.Listener`'s: the listener reconnects with
its backoff, and the round waits for a notification and runs in one
worker-thread call (:meth:`~bothy_notify.store.listen.Listening.wait_then`).

Poison events. When a round raises (an event type this version does not know,
a payload the projection cannot apply, a bug), its transaction rolls back and
the next rounds isolate the culprit (:class:`Isolation`): the events before
the part that was in progress go in one round, then the suspects are halved
until a round of the culprit alone fails again. That event is recorded in
``bothy.dead_letters`` together with the cursor moving past it, counted in
``bothy_events_dead_lettered_total{type}``, logged by type and code location
(never its payload), and the round goes on. Every other event is decided
exactly as without the culprit, in log order, each round still committing its
projections, jobs and cursor together. The happy path pays nothing for this
(no savepoints): a failing event costs its retries. A lost database is never
poison (:class:`StoreUnavailable`: reconnect and read again), and a deadlock or
serialization failure (:class:`StoreContention`) retries the same round.

Local jobs. A node that runs some of the jobs it decides at once (role
``all``: its gateway hints; :class:`LocalJobs`) has the round insert them
already claimed by this node, with a lease (``store.jobs.ClaimHere``). After
the commit, still in the round's worker thread, their checks run as one
statement on the round's connection, and the jobs go to the node's job runner
in memory: no claim round trip, no extra worker-thread hop. Nothing leaves the
process before the commit; a crash after it leaves them to their lease (the
housekeeper makes them available again), so delivery stays at least once.

Blocked. Events are read only behind the oldest running transaction (see
:mod:`bothy_notify.store.events`). While committed events wait behind one, the
round checks again after 5 ms, doubling up to ``notify.poll_interval``, and
``bothy_consumer_blocked_seconds`` says for how long it has been waiting.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Protocol

import trio

from bothy_notify.config import LiveConfig
from bothy_notify.kernel.backoff import Backoff
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.supervise import error_type, error_where
from bothy_notify.notify.catalogue import CatalogueSource
from bothy_notify.notify.facts import PresenceSource
from bothy_notify.notify.planner import RoundOutcome, RoundPlanner
from bothy_notify.notify.routes import LiveRoutes
from bothy_notify.store import deadletters
from bothy_notify.store import events as eventlog
from bothy_notify.store import jobs as jobqueue
from bothy_notify.store.db import (
    DEFAULT_TIMEOUTS,
    Conn,
    DatabaseTimeouts,
    StoreContention,
    StoreError,
    StoreUnavailable,
)
from bothy_notify.store.events import Event
from bothy_notify.store.jobs import ClaimHere, Job
from bothy_notify.store.listen import Listener, Listening, Notification, reconnect_backoff
from bothy_notify.store.migrate import load_event_schemas

log = logging.getLogger("bothy.notify.round")

ROUND_LOCK_KEY = 0x626F_7468
"""Session advisory lock of the consumer round ("both"); one holder per database."""

EVENTS_CHANNEL = "bothy_events"

_BLOCKED_FIRST = 0.005
"""First wait (seconds) when committed events wait behind an older running transaction:
most such transactions are a producer's append about to commit. Doubles up to
``notify.poll_interval`` while the wait lasts."""

_CONTENTION_RETRY = 0.05
"""Seconds before running a round again after a deadlock or serialization failure."""

UNKNOWN_TYPE_LABEL = "unknown"
"""The ``type`` label of dead letters whose type this version does not ship a schema
for: label values stay a closed set."""


class LocalJobs(Protocol):
    """Jobs this node runs itself as soon as the round that decided them commits.

    The round asks :meth:`claim_here` before each round, inserts the jobs it
    selects already claimed by this node, and after the commit calls
    :meth:`prepare` (in its worker thread, on its own connection) and then
    :meth:`hand_over` (in the Trio thread). The wiring gives role ``all`` one
    for its gateway hints (:class:`~bothy_notify.notify.jobs.gateway_send.LocalGatewayHints`).
    """

    def claim_here(self) -> ClaimHere | None:
        """Which jobs to insert claimed (``None``: none now). Called in the round's
        worker thread; reads counters only."""
        ...

    def prepare(self, conn: Conn, jobs: list[Job]) -> object:
        """Blocking work on the round's connection after the commit (the jobs'
        checks). What it returns goes to :meth:`hand_over`; should it raise, the
        jobs are handed over with ``None``."""
        ...

    async def hand_over(self, jobs: list[Job], prepared: object | None) -> None:
        """Start ``jobs`` (committed, claimed by this node). Never raises for a job's
        sake; a job it cannot start is given back or left to its lease."""
        ...


def blocked_backoff(poll: float) -> Backoff:
    """The waits while the round stays blocked: 5 ms doubling to ``poll``."""
    return Backoff(initial=min(_BLOCKED_FIRST, poll), cap=poll)


@dataclass
class Isolation:
    """Where the culprit of a failed round may be; decides how many events the next
    round reads.

    ``clean`` events at the head of the log applied without error before the
    failure (they go in one round); the culprit is among the ``suspects``
    events after them. Suspects are halved until a round of one event fails
    again: that event is the culprit. A round that read the suspects and did not
    fail clears them (a failure that did not repeat).
    """

    clean: int = 0
    suspects: int = 0

    @property
    def active(self) -> bool:
        return bool(self.clean or self.suspects)

    def limit(self, batch_size: int) -> int:
        """How many events the next round reads."""
        if self.clean:
            return min(self.clean, batch_size)
        if self.suspects:
            return max(1, self.suspects // 2)
        return batch_size

    def succeeded(self, consumed: int) -> None:
        """A round committed ``consumed`` events."""
        if not consumed:  # nothing left to read: whatever was suspect is gone
            self.clean = self.suspects = 0
        elif self.clean:
            self.clean = max(0, self.clean - consumed)
        elif self.suspects:
            self.suspects = max(0, self.suspects - consumed)

    def failed(self, read: int, in_progress: tuple[int, int] | None) -> bool:
        """A round that read ``read`` events failed; ``in_progress`` is the span of
        them being applied or decided when it did, if known. Returns true when the
        culprit is found: the first of the events that round read."""
        if read == 1 and not self.clean and self.suspects:
            self.suspects = 0
            return True
        start, end = in_progress if in_progress is not None else (0, read)
        self.clean, self.suspects = start, max(1, end - start)
        return False


class ConsumerRound:
    """The round as a Trio service.

    Args:
        database_url: URL for the dedicated connection.
        timeouts: the bounds of that connection's waits (``[database]``).
        config: the node's live configuration (``notify.*``, ``push.max_attempts``),
            read once per round: a reload reaches the next round.
        clock: the injected clock; the round's ``now`` for windows and schedules.
        presence: who is connected (``NoPresence`` in role ``worker`` of a single
            node; :class:`~bothy_notify.notify.facts.SharedPresence` in a cluster).
        live: how gateway and delayed routes become jobs.
        metrics: the metrics registry.
        before_commit: test seam, called inside the transaction just before commit.
        jobs_committed: called (in the Trio thread) after a round committed jobs; the
            wiring nudges this node's job runner with it, so a due job starts without
            waiting for its ``NOTIFY`` to come back from the database.
        catalogue: the kind catalogue, refreshed once per round; its version is
            fixed on the round's hints (``mv``).
        local: the jobs this node runs at once after the commit (role ``all``: its
            gateway hints); ``None`` leaves every job to the runners' claims.
        instrument: told of the round's stages (:mod:`bothy_notify.kernel.instrument`).
    """

    def __init__(
        self,
        *,
        database_url: str,
        config: LiveConfig,
        clock: Clock,
        presence: PresenceSource,
        live: LiveRoutes,
        metrics: Metrics,
        before_commit: Callable[[RoundOutcome], None] | None = None,
        jobs_committed: Callable[[], None] | None = None,
        catalogue: CatalogueSource | None = None,
        local: LocalJobs | None = None,
        timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS,
        instrument: Instrument | None = None,
    ) -> None:
        self._local = local
        self._instrument = instrument
        self._claimed: list[Job] = []
        self._prepared: object | None = None
        self._catalogue = catalogue
        self._config = config
        self._clock = clock
        self._presence = presence
        self._live = live
        self._metrics = metrics
        self._before_commit = before_commit
        self._jobs_committed = jobs_committed
        self._committed_jobs = 0
        poll = config.current.notify.poll_interval.total_seconds()
        self._listener = Listener(
            database_url,
            (EVENTS_CHANNEL,),
            name="round",
            reconnect=reconnect_backoff(poll),
            catch_up=self._catch_up,
            timeouts=timeouts,
            # A round a server crash loses is read and decided again (the cursor moves
            # with it): its commit need not wait for the WAL flush.
            asynchronous_commit=True,
        )
        self._wait_until: float | None = None
        """While set, the log was drained: wait for a notification until then
        (``time.monotonic()``, the poll interval), then run a round anyway."""
        self._known_types = frozenset(load_event_schemas())
        self._isolation = Isolation()
        self._reading: list[Event] = []
        self._planner: RoundPlanner | None = None
        self._blocked = blocked_backoff(poll).retries()
        self._blocked_since: datetime | None = None
        self.is_holder = False
        self.lock_attempts = 0
        self.dead_lettered = 0
        self.blocked_waits: deque[float] = deque(maxlen=64)
        """The most recent waits while blocked, in seconds (statistics, tests)."""

    def __repr__(self) -> str:
        return f"ConsumerRound(holder={self.is_holder})"

    @property
    def connected(self) -> bool:
        """The round's connection is open (holder or standby: ``/readyz``)."""
        return self._listener.connected

    def holds(self) -> bool:
        """This node holds the round and listens for wake-ups (the HTTP API's appender
        then wakes it with :meth:`wake` instead of ``NOTIFY``: ``store.appender``)."""
        return self.is_holder and self._listener.statistics().listening

    def wake(self) -> None:
        """Run a round soon, as ``NOTIFY bothy_events`` would: events were committed.
        Never blocks; a wake-up while a round runs makes the next one start at once."""
        self._listener.nudge()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold or wait for the round until cancelled; reconnect after a lost connection.

        ``task_status.started()`` once this node holds the round and ``LISTEN
        bothy_events`` is in effect, or once its first lock attempt found
        another holder (a standby listens to nothing). Cancellation: the wait
        ends at once, a round under way finishes first (never abandoned), then
        the connection closes. A lost database reconnects
        (:class:`~bothy_notify.store.listen.Listener`); another exception (a bug
        outside a round) ends this, and the daemon's supervisor starts it again.
        """
        await self._listener.run(self._serve, task_status=task_status)

    async def _serve(self, listening: Listening) -> None:
        """One connection: stand by until the lock is ours, then hold the round."""
        poll = self._config.current.notify.poll_interval.total_seconds()
        try:
            held = await self._try_lock(listening)
            if not held:
                listening.standing_by()
            while not held:
                await trio.sleep(poll)
                held = await self._try_lock(listening)
            await self._hold(listening)
        finally:
            self._set_holder(False)
            self._set_blocked(None)
            with trio.CancelScope(shield=True):
                await self._give_back(listening)

    async def _try_lock(self, listening: Listening) -> bool:
        self.lock_attempts += 1
        self._metrics.consumer_lock_attempts.inc()
        return await listening.run(_try_lock)

    async def _catch_up(self, _listening: Listening) -> None:
        """After every (re)connection: the first round runs at once, without waiting
        for a notification; it reads everything after the cursor, what was appended
        while nobody listened included."""
        self._wait_until = None

    async def _hold(self, listening: Listening) -> None:
        self._isolation = Isolation()  # what another holder did meanwhile is unknown
        self._set_holder(True)
        log.info("this node holds the consumer round")
        await listening.listen()
        poll = self._config.current.notify.poll_interval.total_seconds()
        batch_size = self._config.current.notify.batch_size
        last_lag = 0.0
        while True:
            wait = 0.0
            if self._wait_until is not None:
                wait = max(0.0, self._wait_until - time.monotonic())
            limit = self._isolation.limit(batch_size)
            self._reading = []
            try:
                ran = await listening.wait_then(partial(self._wait_and_round, limit=limit), wait)
            except StoreUnavailable:
                raise
            except StoreContention:
                log.info("the round met a concurrent transaction; running it again")
                self._wait_until = None
                await trio.sleep(_CONTENTION_RETRY)
                continue
            except Exception as exc:
                self._wait_until = None
                await self._failed(listening, exc)
                continue
            self._wait_until = None
            consumed, blocked = ran
            await self._hand_over()
            self._isolation.succeeded(consumed)
            if not blocked and self._blocked_since is not None:
                self._set_blocked(None)
            if self._committed_jobs and self._jobs_committed is not None:
                self._jobs_committed()
            if time.monotonic() - last_lag >= poll:
                last_lag = time.monotonic()
                await listening.run(self._sample_lag)
            if consumed >= limit or self._isolation.active:
                await trio.lowlevel.checkpoint()
                continue
            if blocked:
                wait = self._blocked.failed()
                self._set_blocked(wait)
                await trio.sleep(wait)
                continue
            # A short batch drained the log. Appends that committed meanwhile left their
            # NOTIFY queued on this connection, so the wait returns at once for them.
            self._wait_until = time.monotonic() + poll

    def _wait_and_round(
        self, conn: Conn, notifications: list[Notification], *, limit: int
    ) -> tuple[int, bool]:
        """Blocking, in the worker thread right after the wait
        (:meth:`~bothy_notify.store.listen.Listening.wait_then`): a notification came,
        or the poll interval passed without one, or the round runs at once. Runs
        one round and prepares its local jobs, all in this thread call (a
        notification starts the round without a hop through Trio). Returns what
        :meth:`_round_once` returns.
        """
        if notifications and self._instrument is not None:
            self._instrument.round_woken()
        ran = self._round_once(conn, limit)
        self._prepare_local(conn)
        return ran

    def _prepare_local(self, conn: Conn) -> None:
        """After the commit: the local jobs' checks (:meth:`LocalJobs.prepare`). Blocking.

        The jobs are committed and claimed, so nothing here may lose them: should
        the checks fail, they are handed over unprepared and the runner's handler
        checks them itself."""
        self._prepared = None
        if not self._claimed or self._local is None:
            return
        try:
            self._prepared = self._local.prepare(conn, self._claimed)
            if self._instrument is not None:
                self._instrument.jobs_checked([job.args for job in self._claimed])
        except Exception as exc:
            log.warning(
                "checking this node's new jobs after the round failed; the runner checks them",
                extra={"error_type": error_type(exc), "jobs": len(self._claimed)},
            )

    async def _give_back(self, listening: Listening) -> None:
        """Local jobs committed but never handed over (the round was cancelled while
        its thread ran) are given back, uncounted, instead of waiting for their lease."""
        claimed, self._claimed = self._claimed, []
        if not claimed:
            return
        with trio.move_on_after(5):
            try:
                await listening.run(jobqueue.release, [j.fence for j in claimed])
            except StoreError:
                log.warning("could not give back this node's new jobs; their leases will end")

    async def _hand_over(self) -> None:
        """Give the round's committed local jobs to this node's runner (Trio thread)."""
        claimed, self._claimed = self._claimed, []
        prepared, self._prepared = self._prepared, None
        if self._instrument is not None:
            self._instrument.round_handed_over()
        if claimed and self._local is not None:
            await self._local.hand_over(claimed, prepared)

    async def _failed(self, listening: Listening, exc: Exception) -> None:
        """A round raised: narrow down the culprit, or set it aside once found."""
        batch = self._reading
        planner = self._planner
        in_progress = planner.in_progress if planner is not None else None
        kind, where = error_type(exc), error_where(exc)
        if not batch:
            raise exc  # not an event's doing (reading the batch failed): restart the round
        if not self._isolation.failed(len(batch), in_progress):
            log.warning(
                "a round failed; isolating the event that caused it",
                extra={
                    "error_type": kind,
                    "where": where,
                    "events": len(batch),
                    "suspects": self._isolation.suspects,
                },
            )
            return
        event = batch[0]
        if await listening.run(self._dead_letter, event, kind, where):
            label = event.type if event.type in self._known_types else UNKNOWN_TYPE_LABEL
            self.dead_lettered += 1
            self._metrics.events_dead_lettered.labels(label).inc()
            log.error(
                "an event could not be applied or decided; it is dead-lettered and the round"
                " goes on (bothy-notify events dead-letters)",
                extra={"seq": event.seq, "type": label, "error_type": kind, "where": where},
            )

    def _dead_letter(self, conn: Conn, event: Event, kind: str, where: str) -> bool:
        """Record ``event`` as a dead letter and move the cursor past it, in one
        transaction. Blocking. False when the log's head is no longer that event."""
        now = self._clock.now()
        with conn.transaction():
            _cursor, head = eventlog.lock_and_read(conn, 1)
            if not head or head[0].seq != event.seq:
                return False
            deadletters.record(conn, event, kind, where, now)
            eventlog.save_cursor(conn, eventlog.Cursor(event.xid, event.seq), now)
        return True

    def _round_once(self, conn: Conn, limit: int | None = None) -> tuple[int, bool]:
        """One transaction: batch, projections, decisions, jobs, cursor. Blocking.

        Reads at most ``limit`` events (``notify.batch_size`` by default). Returns
        how many were consumed, and whether committed events wait behind an older
        running transaction (only looked at when nothing could be read).
        """
        now = self._clock.now()
        config = self._config.current  # one configuration for the whole round
        self._committed_jobs = 0
        self._claimed = []
        self._reading = []
        self._planner = None
        instrument = self._instrument
        if instrument is not None:
            instrument.round_started()
        with conn.transaction():
            cursor, batch = eventlog.lock_and_read(
                conn, limit if limit is not None else config.notify.batch_size
            )
            if not batch:
                return 0, _events_blocked(conn, cursor)
            if instrument is not None:
                instrument.round_read([event.payload for event in batch])
            self._reading = batch
            planner = self._planner = RoundPlanner(
                conn,
                now=now,
                config=config,
                presence=self._presence,
                live=self._live,
                catalogue=self._catalogue,
            )
            if self._local is not None:
                planner.writer.claim_here(self._local.claim_here())
            planner.feed(batch)
            planner.writer.flush_copy()  # COPY cannot run in a pipeline
            last = batch[-1]
            with conn.pipeline():  # the round's last writes in one round trip
                planner.finish()
                eventlog.save_cursor(conn, eventlog.Cursor(last.xid, last.seq), now)
            outcome = planner.outcome
            if self._before_commit is not None:
                self._before_commit(outcome)
        if instrument is not None:
            instrument.round_committed()
        self._claimed = planner.writer.claimed
        # Claimed jobs need no runner's claim: the runner is nudged for the others only.
        self._committed_jobs = outcome.jobs - len(self._claimed)
        self._reading = []
        self._planner = None
        self._record(len(batch), outcome)
        return len(batch), False

    def _record(self, consumed: int, outcome: RoundOutcome) -> None:
        m = self._metrics
        m.events_consumed.inc(consumed)
        for reason, n in outcome.skips.items():
            m.skip(reason, n)
        for kind, n in outcome.hints.items():
            m.hints.labels(kind).inc(n)
        if outcome.folded:
            m.hints_coalesced.inc(outcome.folded)
        if outcome.deduplicated:
            m.hints_deduplicated.inc(outcome.deduplicated)
        if outcome.group_mentions_refused:
            m.group_mentions_refused.inc(outcome.group_mentions_refused)
        m.registration("invalidated", outcome.registrations_invalidated, cause="device_revoked")
        outcome.topics.record(m)

    def _sample_lag(self, conn: Conn) -> None:
        with conn.transaction():
            lag = eventlog.lag(conn)
        self._metrics.consumer_lag_events.set(lag.events)
        age = 0.0
        if lag.oldest is not None:
            age = max(0.0, (datetime.now(lag.oldest.tzinfo) - lag.oldest).total_seconds())
        self._metrics.consumer_lag_seconds.set(age)

    def _set_blocked(self, wait: float | None) -> None:
        """``wait``: the round is blocked and waits that long; ``None``: it is not."""
        if wait is None:
            self._blocked_since = None
            self._blocked.succeeded()
            self._metrics.consumer_blocked_seconds.set(0)
            return
        now = self._clock.now()
        if self._blocked_since is None:
            self._blocked_since = now
        if self._instrument is not None:
            self._instrument.round_blocked(wait)
        self.blocked_waits.append(wait)
        self._metrics.consumer_blocked_seconds.set((now - self._blocked_since).total_seconds())

    def _set_holder(self, value: bool) -> None:
        self.is_holder = value
        self._metrics.consumer_holder.set(1 if value else 0)


def _try_lock(conn: Conn) -> bool:
    with conn.transaction():  # a session lock: it outlives this transaction
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (ROUND_LOCK_KEY,)).fetchone()
    return bool(row and row[0])


def _events_blocked(conn: Conn, cursor: eventlog.Cursor) -> bool:
    """Whether committed events wait behind a transaction that is still running."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM bothy.events WHERE (xid, seq) > (%s::text::xid8, %s))",
        (str(cursor.xid), cursor.seq),
    ).fetchone()
    return bool(row and row[0])
