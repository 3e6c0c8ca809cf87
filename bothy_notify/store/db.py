"""The connection pool and the one way to run SQL from Trio.

Errors (module hierarchy)::

    StoreError                 the database could not do what was asked
    ├── StoreUnavailable       it could not be reached at all (or the connection broke)
    ├── StoreConflict          a uniqueness rule refused a concurrent write
    └── StoreContention        a concurrent transaction got in the way (deadlock,
                               serialization failure): the same work may simply be retried

``store`` is the only package that knows psycopg's errors: :meth:`Database.run`
and :func:`translated` turn every ``psycopg.Error`` into one of these (``raise
... from exc``), so callers catch :class:`StoreError` only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial, wraps
from typing import Any, ParamSpec, TypeVar

import psycopg
import trio
from psycopg_pool import ConnectionPool, PoolTimeout

log = logging.getLogger("bothy.store")

T = TypeVar("T")
P = ParamSpec("P")

Conn = psycopg.Connection[Any]


class StoreError(Exception):
    """The database refused or failed an operation."""


class StoreUnavailable(StoreError):
    """The database cannot be reached, or the connection broke."""


class StoreConflict(StoreError):
    """A uniqueness rule refused the write (another writer got there first)."""


class StoreContention(StoreError):
    """A concurrent transaction got in the way (deadlock, serialization failure).

    Nothing is wrong with the work itself: run it again.
    """


@contextmanager
def translate_errors() -> Iterator[None]:
    """Translate psycopg's errors raised inside the block into :class:`StoreError`.

    A lost or unreachable server becomes :class:`StoreUnavailable`, a unique
    violation :class:`StoreConflict`, anything else :class:`StoreError`. The
    message is constant (psycopg's may quote values); the cause is kept.
    """
    try:
        yield
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
        raise StoreUnavailable("the database cannot be reached") from exc
    except psycopg.errors.UniqueViolation as exc:
        raise StoreConflict("a concurrent write got there first") from exc
    except psycopg.errors.TransactionRollback as exc:
        raise StoreContention("a concurrent transaction got in the way") from exc
    except psycopg.Error as exc:
        raise StoreError(f"the database refused the operation ({type(exc).__name__})") from exc


def translated(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with its psycopg errors translated (for work on dedicated connections)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with translate_errors():
            return fn(*args, **kwargs)

    return wrapper


CONNECT_PARAMETERS: dict[str, Any] = {
    # A host that does not answer must not hold a reconnecting service for the kernel's
    # TCP timeout (minutes): fail the attempt, the caller retries with its backoff.
    "connect_timeout": 10,
    # A server that vanished without closing its sockets (host down, network cut) is
    # noticed within about a minute instead of when the kernel gives up (hours).
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
"""libpq parameters of every connection the daemon opens (pooled or dedicated)."""

POOL_WAIT = 30.0
"""Default seconds a caller waits for a free pooled connection before
:class:`StoreUnavailable` (work that may wait: jobs, housekeeping)."""

PING_CACHE = 1.0
"""Seconds a ping's answer is reused: ``/readyz`` polled by many balancers costs one
query per second at most."""

PING_WAIT = 2.0
"""Seconds a ping waits for a pooled connection; past it the database counts as down."""

PROBE_EVERY = 1.0
"""While the pool could not get a connection at all, one caller per this many seconds
tries the database; the others fail at once instead of queueing behind the wait."""


class Database:
    """A pool of connections plus a limiter, used from Trio.

    The daemon opens two: one for the HTTP API and the gateway, one for the job
    runner and housekeeping, so load on one never starves the other (the
    consumer round has a connection of its own).

    Args:
        url: the PostgreSQL connection URL (never logged).
        pool_size: connections in the pool and worker threads allowed at once.
        name: the pool's name (``api``, ``jobs``), for psycopg's logs.
        wait: seconds a caller waits for a free connection before
            :class:`StoreUnavailable`; an HTTP request should not wait long.
    """

    def __init__(
        self, url: str, *, pool_size: int = 10, name: str = "bothy", wait: float = POOL_WAIT
    ) -> None:
        self._url = url
        self.pool_size = pool_size
        self.name = name
        self._pool = ConnectionPool(
            url,
            min_size=min(2, pool_size),
            max_size=pool_size,
            open=False,
            # Transactions are explicit (``conn.transaction()`` in :meth:`run_sync`), so a
            # single-statement read can skip BEGIN/COMMIT: one round trip instead of three.
            kwargs={"autocommit": True, **CONNECT_PARAMETERS},
            name=name,
            timeout=wait,
        )
        self.limiter = trio.CapacityLimiter(pool_size)
        self._ping_limiter = trio.CapacityLimiter(1)
        self._ping_answer: tuple[float, bool] | None = None
        self._ping_running: trio.Event | None = None
        self._next_probe = 0.0
        self.pings = 0
        """Pings that really reached for the database (statistics, tests)."""
        self.unreachable = False
        """True from a wait for a connection that timed out until the next success."""

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
        """Close the pool; waits for connections in use to be returned."""
        await trio.to_thread.run_sync(self._pool.close)

    def run_sync(self, fn: Callable[[Conn], T], *, transaction: bool = True) -> T:
        """Run ``fn(conn)`` on this thread, in one transaction unless told otherwise.

        Raises :class:`StoreError` (psycopg's errors translated); a
        :class:`StoreError` that ``fn`` raises itself passes unchanged.
        """
        with translate_errors(), self._pool.connection() as conn:
            if not transaction:
                return fn(conn)
            with conn.transaction():
                return fn(conn)

    async def run(self, fn: Callable[[Conn], T], *, transaction: bool = True) -> T:
        """Run ``fn(conn)`` in a worker thread, in one transaction.

        The transaction commits when ``fn`` returns and rolls back when it
        raises. ``transaction=False`` runs each statement on its own (autocommit):
        only for work whose statements each stand alone, such as a single
        read, where it saves the BEGIN and COMMIT round trips. Cancellation
        waits for ``fn`` to finish: writes are never abandoned halfway.

        Once a wait for a connection timed out (the database cannot be reached),
        callers fail at once with :class:`StoreUnavailable`, except one per
        :data:`PROBE_EVERY` seconds that tries again; the first success ends it.
        So an outage answers quickly instead of queueing every caller behind
        the pool's wait.
        """
        if self.unreachable:
            now = trio.current_time()
            if now < self._next_probe:
                raise StoreUnavailable("the database cannot be reached")
            self._next_probe = now + PROBE_EVERY
        try:
            result = await trio.to_thread.run_sync(
                partial(self.run_sync, fn, transaction=transaction), limiter=self.limiter
            )
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, PoolTimeout) and not self.unreachable:
                log.warning("the database cannot be reached", extra={"pool": self.name})
                self.unreachable = True
                self._next_probe = trio.current_time() + PROBE_EVERY
            raise
        if self.unreachable:
            log.info("the database answers again", extra={"pool": self.name})
            self.unreachable = False
        return result

    async def ping(self, *, share: bool = True) -> bool:
        """Whether a trivial query answers (``/readyz``).

        An answer is reused for :data:`PING_CACHE` seconds, and callers that
        arrive while a ping runs wait for that one: however often readiness is
        polled, the database sees at most one ping a second. The ping has its
        own worker thread, so it never queues behind API work, waits at most
        :data:`PING_WAIT` for a connection and gives up (false) a second later.

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
        # A read may be abandoned (unlike a write): a server that accepts and never
        # answers must not hold readiness. The limiter keeps it to one such thread.
        with trio.move_on_after(PING_WAIT + 1):
            try:
                await trio.to_thread.run_sync(
                    self._ping_sync, limiter=self._ping_limiter, abandon_on_cancel=True
                )
                return True
            except StoreError:
                return False
        return False

    def _ping_sync(self) -> None:
        with translate_errors(), self._pool.connection(timeout=PING_WAIT) as conn:
            conn.execute("SELECT 1").fetchone()


def connect_dedicated(url: str, *, autocommit: bool = True) -> Conn:
    """A connection outside the pool (advisory lock holder, LISTEN); autocommit by
    default, so explicit ``conn.transaction()`` blocks are the only transactions."""
    try:
        return psycopg.connect(url, autocommit=autocommit, **CONNECT_PARAMETERS)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable("the database cannot be reached") from exc


def connection_limit(url: str) -> int:
    """Connections the server at ``url`` lets ordinary roles open: ``max_connections``
    minus those reserved for superusers. Blocking.

    Raises:
        StoreError: the database cannot be reached.
    """
    with translate_errors():
        conn = connect_dedicated(url)
        try:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
            ).fetchone()
        finally:
            conn.close()
    assert row is not None
    return int(row[0])
