"""The connection pool and the one way to run SQL from Trio.

Errors (module hierarchy)::

    StoreError                 the database could not do what was asked
    ├── StoreUnavailable       it could not be reached at all (or the connection broke)
    └── StoreConflict          a uniqueness rule refused a concurrent write

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
    except psycopg.Error as exc:
        raise StoreError(f"the database refused the operation ({type(exc).__name__})") from exc


def translated(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with its psycopg errors translated (for work on dedicated connections)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with translate_errors():
            return fn(*args, **kwargs)

    return wrapper


class Database:
    """A pool of connections plus a limiter, used from Trio.

    Args:
        url: the PostgreSQL connection URL (never logged).
        pool_size: connections in the pool and worker threads allowed at once.
    """

    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self._url = url
        self.pool_size = pool_size
        self._pool = ConnectionPool(
            url,
            min_size=min(2, pool_size),
            max_size=pool_size,
            open=False,
            # Transactions are explicit (``conn.transaction()`` in :meth:`run_sync`), so a
            # single-statement read can skip BEGIN/COMMIT: one round trip instead of three.
            kwargs={"autocommit": True},
            name="bothy",
            timeout=30.0,
        )
        self.limiter = trio.CapacityLimiter(pool_size)

    @property
    def url(self) -> str:
        """The connection URL, for dedicated connections (never log it)."""
        return self._url

    def __repr__(self) -> str:
        return f"Database(pool_size={self.pool_size})"

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
        """
        return await trio.to_thread.run_sync(
            partial(self.run_sync, fn, transaction=transaction), limiter=self.limiter
        )

    async def ping(self) -> bool:
        """Whether a trivial query answers (``/readyz``)."""
        try:
            with trio.fail_after(5):
                await self.run(lambda c: c.execute("SELECT 1").fetchone())
        except (trio.TooSlowError, StoreError):
            return False
        return True


def connect_dedicated(url: str, *, autocommit: bool = True) -> Conn:
    """A connection outside the pool (advisory lock holder, LISTEN); autocommit by
    default, so explicit ``conn.transaction()`` blocks are the only transactions."""
    try:
        return psycopg.connect(url, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable("the database cannot be reached") from exc
