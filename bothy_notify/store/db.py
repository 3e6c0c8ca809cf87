"""The connection pool and the one way to run SQL from Trio.

:class:`Database` runs psycopg's synchronous driver in worker threads (psycopg's
async API is asyncio-only), behind a :class:`trio.CapacityLimiter` sized to the
pool, and drives one connection from the Trio thread itself for the hot path's
single statements (:attr:`Database.direct`, :mod:`bothy_notify.store.direct`).

The errors, the bounds of every wait and the connect helpers live in
:mod:`bothy_notify.store.connection` (its docstring draws the error tree and
states the one cancellation rule); they are re-exported here, where most
callers import them from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

import trio
from psycopg_pool import ConnectionPool, PoolTimeout

from bothy_notify.store.connection import (
    BULK_TIMEOUT,
    DEFAULT_TIMEOUTS,
    BoundedConnection,
    Conn,
    DatabaseTimeouts,
    StatementError,
    StoreConflict,
    StoreContention,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    configure,
    connect_dedicated,
    connection_limit,
    translate_errors,
    translated,
)
from bothy_notify.store.direct import DirectConnection
from bothy_notify.store.servers import SERVERS

log = logging.getLogger("bothy.store")

T = TypeVar("T")


POOL_WAIT = 30.0
"""Default seconds a caller waits for a free pooled connection before
:class:`StoreUnavailable` (work that may wait: jobs, housekeeping)."""

POOL_RECONNECT = 5.0
"""Seconds a pool keeps retrying (psycopg_pool's backoff: 1 s, 2 s, ...) to replace a
lost connection before it gives the slot up; a caller that finds the pool empty then
starts a fresh attempt at once. psycopg_pool's own default (5 minutes) lets the
backoff grow to minutes: a pool would come back that long after the server did."""

PING_CACHE = 1.0
"""Seconds a ping's answer is reused: ``/readyz`` polled by many balancers costs one
query per second at most."""

PROBE_EVERY = 1.0
"""While the database cannot be reached (a wait for a connection timed out, or the
server did not answer), one caller at a time, at most one per this many seconds,
tries it; the others fail at once instead of queueing behind the wait."""


class Database:
    """A pool of connections plus a limiter, used from Trio.

    The daemon opens up to three: one for the HTTP API, one for the gateway, one
    for the job runner and housekeeping, so load on one never starves another
    (the consumer round has a connection of its own).

    Args:
        url: the PostgreSQL connection URL (never logged); a multi-host URL is
            tried host by host (``connect_timeout`` each).
        pool_size: connections in the pool and worker threads allowed at once.
        name: the pool's name (``api``, ``jobs``), for psycopg's logs.
        wait: seconds a caller waits for a free connection before
            :class:`StoreUnavailable`; an HTTP request should not wait long.
        timeouts: the bounds of every wait (``[database]``).
        direct_asynchronous_commit: the :attr:`direct` connection's commits return
            before their WAL is flushed (the job runner's completions, which the
            runner redoes after a server crash; see
            :mod:`bothy_notify.store.connection`). The pool's commits stay
            synchronous.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        name: str = "bothy",
        wait: float = POOL_WAIT,
        timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS,
        direct_asynchronous_commit: bool = False,
    ) -> None:
        self._url = url
        self._direct_asynchronous_commit = direct_asynchronous_commit
        self.pool_size = pool_size
        self.name = name
        self.timeouts = timeouts
        self._pool = ConnectionPool(
            url,
            connection_class=BoundedConnection,
            min_size=min(2, pool_size),
            max_size=pool_size,
            open=False,
            # Transactions are explicit (``conn.transaction()`` in :meth:`run_sync`), so a
            # single-statement read can skip BEGIN/COMMIT: one round trip instead of three.
            kwargs={"autocommit": True, **timeouts.libpq()},
            configure=partial(configure, timeouts=timeouts),
            name=name,
            timeout=wait,
            reconnect_timeout=POOL_RECONNECT,
        )
        self.limiter = trio.CapacityLimiter(pool_size)
        self._probe_limiter = trio.CapacityLimiter(1)
        self._ping_limiter = trio.CapacityLimiter(1)
        self._ping_answer: tuple[float, bool] | None = None
        self._ping_running: trio.Event | None = None
        self._next_probe = 0.0
        self.pings = 0
        """Pings that really reached for the database (statistics, tests)."""
        self.unreachable = False
        """True from a wait for a connection that timed out, or a server that did not
        answer, until the next success."""
        self.answered_at = float("-inf")
        """When (``trio.current_time()``) a statement last succeeded: a service whose
        own statement failed is healthy again once another of the pool's succeeds."""
        self._answer: trio.Event | None = None
        self._probing = False
        self._direct: DirectConnection | None = None
        # A server found lost by any connection of the process: drop ours at once.
        SERVERS.on_lost(self._drop_connections)

    @property
    def url(self) -> str:
        """The connection URL, for dedicated connections (never log it)."""
        return self._url

    def __repr__(self) -> str:
        return f"Database(name={self.name!r}, pool_size={self.pool_size})"

    async def open(self) -> None:
        """Open the pool and wait until one connection works."""
        with translate_errors():
            await trio.to_thread.run_sync(lambda: self._pool.open(wait=True, timeout=30.0))

    async def close(self) -> None:
        """Close the pool (waits for connections in use to be returned) and the
        :attr:`direct` connection."""
        if self._direct is not None:
            await self._direct.aclose()
        await trio.to_thread.run_sync(self._pool.close)

    @property
    def direct(self) -> DirectConnection:
        """A connection used from the Trio thread without a worker thread
        (:mod:`bothy_notify.store.direct`), opened at its first statement and closed
        with the pool. Outside the pool's size."""
        if self._direct is None:
            self._direct = DirectConnection(
                self._url,
                timeouts=self.timeouts,
                asynchronous_commit=self._direct_asynchronous_commit,
            )
        return self._direct

    def run_sync(
        self,
        fn: Callable[[Conn], T],
        *,
        transaction: bool = True,
        bulk: bool = False,
        wait: float | None = None,
    ) -> T:
        """Run ``fn(conn)`` on this thread, in one transaction unless told otherwise
        (``bulk``: see :meth:`run`); ``wait``: seconds to wait for a connection
        (the pool's ``wait`` by default).

        Raises :class:`StoreError` (psycopg's errors translated); a
        :class:`StoreError` that ``fn`` raises itself passes unchanged.
        """
        with translate_errors(), self._pool.connection(timeout=wait) as conn:
            assert isinstance(conn, BoundedConnection)
            with conn.watching():
                if not transaction:
                    return fn(conn)
                with conn.transaction():
                    if bulk:
                        return self._bulk(conn, fn)
                    return fn(conn)

    @staticmethod
    def _bulk(conn: Conn, fn: Callable[[Conn], T]) -> T:
        assert isinstance(conn, BoundedConnection)
        ms = round((BULK_TIMEOUT - 1) * 1000)
        conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{ms}ms",))
        with conn.responses_within(BULK_TIMEOUT):
            return fn(conn)

    async def run(
        self, fn: Callable[[Conn], T], *, transaction: bool = True, bulk: bool = False
    ) -> T:
        """Run ``fn(conn)`` in a worker thread, in one transaction.

        The transaction commits when ``fn`` returns and rolls back when it
        raises. ``transaction=False`` runs each statement on its own (autocommit):
        only for work whose statements each stand alone, such as a single
        read, where it saves the BEGIN and COMMIT round trips. ``bulk`` (in a
        transaction) gives each statement :data:`BULK_TIMEOUT` instead of
        ``statement_timeout`` and ``response_timeout``: the hourly sweep.

        Cancellation waits for ``fn`` to finish, which every wait for the server
        bounds (``database.response_timeout``): writes are never abandoned
        halfway, and the result comes back before the cancellation is delivered.

        Once the database could not be reached (a wait for a connection timed
        out, or the server did not answer), callers fail at once with
        :class:`StoreUnavailable`, except one at a time, at most one per
        :data:`PROBE_EVERY` seconds, that tries again; the first success ends
        it. So an outage answers quickly instead of queueing every caller behind
        the pool's wait. The probe has a worker thread of its own and waits for
        a connection no longer than :meth:`probe_wait`: a new caller asking is
        what makes the pool try to connect again (psycopg_pool gives up a
        connection after :data:`POOL_RECONNECT` and tries anew for a caller that
        arrives, not for one already waiting), so probes must keep coming while
        the callers that waited before the outage was noticed still wait.
        """
        started = trio.current_time()
        probe = self._may_try()
        try:
            result = await trio.to_thread.run_sync(
                partial(
                    self.run_sync,
                    fn,
                    transaction=transaction,
                    bulk=bulk,
                    wait=self.probe_wait() if probe else None,
                ),
                limiter=self._probe_limiter if probe else self.limiter,
            )
        except StoreUnavailable as exc:
            if isinstance(exc, StoreTimeout) or isinstance(exc.__cause__, PoolTimeout):
                self._unreachable(started)
            raise
        finally:
            if probe:
                self._probing = False
        self._answered()
        return result

    def probe_wait(self) -> float:
        """Seconds a probe waits for a connection: enough for a connection through a
        URL whose first host is frozen (``connect_timeout``), never the pool's
        whole ``wait``."""
        return min(self._pool.timeout, max(1.0, self.timeouts.connect + 1.0))

    async def query_direct(
        self, name: bytes, sql: bytes, params: Sequence[bytes | None]
    ) -> list[list[bytes | None]]:
        """One statement on the :attr:`direct` connection, from the Trio thread (see
        :meth:`DirectConnection.query <bothy_notify.store.direct.DirectConnection.query>`).

        Shares :meth:`run`'s outage rule: once the database could not be reached
        (here: the connection could not be made, broke or did not answer),
        callers fail at once but one per :data:`PROBE_EVERY` seconds, and the
        first success ends it. A server that did not answer empties the pool too.
        """
        started = trio.current_time()
        probe = self._may_try()
        try:
            rows = await self.direct.query(name, sql, params)
        except StoreUnavailable as exc:
            # A statement the server refused (cancelled in time, or a write refused as
            # read-only: the next connection goes to the new primary) says it answers.
            if not isinstance(exc.__cause__, StatementError):
                self._unreachable(started)
            raise
        finally:
            if probe:
                self._probing = False
        self._answered()
        return rows

    def _drop_connections(self) -> None:
        """A server was found lost (:mod:`bothy_notify.store.servers`; any thread):
        empty the pool (connections in use are closed when they come back; new ones
        try the URL's hosts, the lost one last) and reconnect the direct connection
        before its next statement."""
        self._pool.drain()
        if self._direct is not None:
            self._direct.reconnect()

    def _may_try(self) -> bool:
        """Fail at once while the database is unreachable, but for one probe at a time,
        at most one a :data:`PROBE_EVERY`. Returns whether this call is the probe."""
        if not self.unreachable:
            return False
        now = trio.current_time()
        if self._probing or now < self._next_probe:
            raise StoreUnavailable("the database cannot be reached")
        self._next_probe = now + PROBE_EVERY
        self._probing = True
        return True

    def _unreachable(self, started: float) -> None:
        """A call begun at ``started`` found the database unreachable. A call that
        began before the last success says nothing new (it waited on a connection
        lost meanwhile, or for one the pool has since made): no fail-fast for it."""
        if self.answered_at >= started:
            return
        if not self.unreachable:
            log.warning("the database cannot be reached", extra={"pool": self.name})
            self.unreachable = True
            self._next_probe = trio.current_time() + PROBE_EVERY

    async def answer_after(self, since: float, at_most: float) -> None:
        """Return once a statement of this pool succeeds after ``since``
        (``trio.current_time()``), or after ``at_most`` seconds: a service whose own
        statement found the database unavailable tries again as soon as another
        got through, rather than a whole retry interval later."""
        with trio.move_on_after(at_most):
            while self.answered_at <= since:
                if self._answer is None:
                    self._answer = trio.Event()
                await self._answer.wait()

    def _answered(self) -> None:
        self.answered_at = trio.current_time()
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.set()
        if self.unreachable:
            log.info("the database answers again", extra={"pool": self.name})
            self.unreachable = False

    async def ping(self, *, share: bool = True) -> bool:
        """Whether a trivial query answers (``/readyz``).

        An answer is reused for :data:`PING_CACHE` seconds, and callers that
        arrive while a ping runs wait for that one: however often readiness is
        polled, the database sees at most one ping a second. The ping has its
        own worker thread, so it never queues behind API work; it waits at most
        ``database.health_check_timeout`` for a connection and as long again for
        the answer, then says false.

        ``share=False`` (a periodic background check) pings on its own, neither
        reusing an answer nor leaving one: ``/readyz`` never answers with what a
        background check saw before a change.
        """
        if not share:
            return await self._ping_now()
        now = trio.current_time()
        if self._ping_answer is not None and now - self._ping_answer[0] < PING_CACHE:
            return self._ping_answer[1]
        if self._ping_running is not None:
            await self._ping_running.wait()
            return self._ping_answer[1] if self._ping_answer is not None else False
        running = self._ping_running = trio.Event()
        try:
            ok = await self._ping_now()
            self._ping_answer = (trio.current_time(), ok)
        finally:
            self._ping_running = None
            running.set()
        return ok

    async def _ping_now(self) -> bool:
        self.pings += 1
        try:
            await trio.to_thread.run_sync(self._ping_sync, limiter=self._ping_limiter)
        except StoreError:
            return False
        self._answered()
        return True

    def _ping_sync(self) -> None:
        bound = self.timeouts.health_check
        with translate_errors(), self._pool.connection(timeout=bound) as conn:
            assert isinstance(conn, BoundedConnection)
            with conn.watching(), conn.responses_within(bound):
                conn.execute("SELECT 1").fetchone()


__all__ = [
    "BULK_TIMEOUT",
    "DEFAULT_TIMEOUTS",
    "PING_CACHE",
    "POOL_RECONNECT",
    "POOL_WAIT",
    "PROBE_EVERY",
    "Conn",
    "Database",
    "DatabaseTimeouts",
    "StatementError",
    "StoreConflict",
    "StoreContention",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "connect_dedicated",
    "connection_limit",
    "translate_errors",
    "translated",
]
