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
``bothy.append_event``) and polls as a fallback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import trio

from bothy_notify.config import Config
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify.catalogue import CatalogueSource
from bothy_notify.notify.facts import PresenceSource
from bothy_notify.notify.planner import RoundOutcome, RoundPlanner
from bothy_notify.notify.routes import LiveRoutes
from bothy_notify.store import events as eventlog
from bothy_notify.store.db import Conn, StoreError, connect_dedicated, translated

log = logging.getLogger("bothy.notify.round")

ROUND_LOCK_KEY = 0x626F_7468
"""Session advisory lock of the consumer round ("both"); one holder per database."""

EVENTS_CHANNEL = "bothy_events"

_WAIT_SLICE = 0.25
"""Longest single wait in a worker thread, so cancellation is seen within this time."""

_BLOCKED_RETRY = 0.005
"""Retry delay when committed events wait behind an older running transaction."""


class ConsumerRound:
    """The round as a Trio service.

    Args:
        database_url: URL for the dedicated connection.
        config: the configuration (``notify.*``, ``push.max_attempts``).
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
    """

    def __init__(
        self,
        *,
        database_url: str,
        config: Config,
        clock: Clock,
        presence: PresenceSource,
        live: LiveRoutes,
        metrics: Metrics,
        before_commit: Callable[[RoundOutcome], None] | None = None,
        jobs_committed: Callable[[], None] | None = None,
        catalogue: CatalogueSource | None = None,
    ) -> None:
        self._url = database_url
        self._catalogue = catalogue
        self._config = config
        self._clock = clock
        self._presence = presence
        self._live = live
        self._metrics = metrics
        self._before_commit = before_commit
        self._jobs_committed = jobs_committed
        self._committed_jobs = 0
        self._limiter = trio.CapacityLimiter(1)
        self.is_holder = False
        self.lock_attempts = 0

    def __repr__(self) -> str:
        return f"ConsumerRound(holder={self.is_holder})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold or wait for the round until cancelled; reconnect after a lost connection.

        ``task_status.started()`` is called after the first connection and lock
        attempt (holder or standby). Cancellation: the current transaction
        finishes first (never abandoned), then the connection closes.
        """
        started = False
        poll = self._config.notify.poll_interval.total_seconds()
        while True:
            conn: Conn | None = None
            try:
                conn = await self._thread(connect_dedicated, self._url)
                held = await self._try_lock(conn)
                if not started:
                    started = True
                    task_status.started()
                while not held:
                    await trio.sleep(poll)
                    held = await self._try_lock(conn)
                await self._hold(conn)
            except StoreError:
                log.warning("consumer round lost its database connection; reconnecting")
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(poll)
            finally:
                self._set_holder(False)
                if conn is not None:
                    with trio.CancelScope(shield=True):
                        await self._thread(conn.close)

    async def _try_lock(self, conn: Conn) -> bool:
        self.lock_attempts += 1
        self._metrics.consumer_lock_attempts.inc()
        held: bool = await self._thread(_try_lock, conn)
        return held

    async def _hold(self, conn: Conn) -> None:
        self._set_holder(True)
        log.info("this node holds the consumer round")
        await self._thread(lambda: conn.execute(f"LISTEN {EVENTS_CHANNEL}"))
        poll = self._config.notify.poll_interval.total_seconds()
        last_lag = 0.0
        while True:
            consumed, blocked = await self._thread(self._round_once, conn)
            if self._committed_jobs and self._jobs_committed is not None:
                self._jobs_committed()
            if time.monotonic() - last_lag >= poll:
                last_lag = time.monotonic()
                await self._thread(self._sample_lag, conn)
            if consumed >= self._config.notify.batch_size:
                await trio.lowlevel.checkpoint()
                continue
            if blocked:
                await trio.sleep(_BLOCKED_RETRY)
                continue
            # A short batch drained the log. Appends that committed meanwhile left their
            # NOTIFY queued on this connection, so the wait returns at once for them.
            await self._wait_for_events(conn, poll)

    async def _wait_for_events(self, conn: Conn, poll: float) -> None:
        deadline = time.monotonic() + poll
        while (remaining := deadline - time.monotonic()) > 0:
            woke = await self._thread(_wait_notify, conn, min(remaining, _WAIT_SLICE))
            if woke:
                return

    def _round_once(self, conn: Conn) -> tuple[int, bool]:
        """One transaction: batch, projections, decisions, jobs, cursor. Blocking."""
        now = self._clock.now()
        self._committed_jobs = 0
        with conn.transaction():
            cursor, batch = eventlog.lock_and_read(conn, self._config.notify.batch_size)
            if not batch:
                return 0, _events_blocked(conn, cursor)
            planner = RoundPlanner(
                conn,
                now=now,
                config=self._config,
                presence=self._presence,
                live=self._live,
                catalogue=self._catalogue,
            )
            planner.feed(batch)
            planner.writer.flush_copy()  # COPY cannot run in a pipeline
            last = batch[-1]
            with conn.pipeline():  # the round's last writes in one round trip
                planner.finish()
                eventlog.save_cursor(conn, eventlog.Cursor(last.xid, last.seq), now)
            outcome = planner.outcome
            if self._before_commit is not None:
                self._before_commit(outcome)
        self._committed_jobs = outcome.jobs
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

    def _set_holder(self, value: bool) -> None:
        self.is_holder = value
        self._metrics.consumer_holder.set(1 if value else 0)

    async def _thread(self, fn: Callable[..., Any], *args: object) -> Any:
        return await trio.to_thread.run_sync(translated(fn), *args, limiter=self._limiter)


def _try_lock(conn: Conn) -> bool:
    with conn.transaction():  # a session lock: it outlives this transaction
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (ROUND_LOCK_KEY,)).fetchone()
    return bool(row and row[0])


def _wait_notify(conn: Conn, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a notification on ``conn``; drain what came."""
    woke = False
    for _ in conn.notifies(timeout=timeout, stop_after=1):
        woke = True
    return woke


def _events_blocked(conn: Conn, cursor: eventlog.Cursor) -> bool:
    """Whether committed events wait behind a transaction that is still running."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM bothy.events WHERE (xid, seq) > (%s::text::xid8, %s))",
        (str(cursor.xid), cursor.seq),
    ).fetchone()
    return bool(row and row[0])
