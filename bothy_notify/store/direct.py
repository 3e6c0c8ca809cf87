"""A connection driven from the Trio thread: a statement without a worker thread.

:meth:`Database.run <bothy_notify.store.db.Database.run>` runs blocking psycopg
in a worker thread. Each call is two hand-overs between threads, and on a busy
machine each costs a scheduling round trip, taken while the GIL is held (a
woken thread preempts the one that woke it): on the public path that was most
of a ``POST /v1/events`` (docs/performance.md, "public path").
:class:`DirectConnection` instead puts libpq in non-blocking mode and waits on
its socket with Trio, so a statement costs what libpq and the server cost. It
runs one prepared statement at a time, with text parameters and text results;
it is for short statements of the hot path (the HTTP API's appends, the
runner's completions), everything else stays on the pool.

It keeps the store's one rule (:mod:`bothy_notify.store.connection`): a
statement once sent is waited for, cancelled or not, for at most
``database.response_timeout``; then its rows come back and the cancellation is
delivered at the caller's next checkpoint. A cancelled caller therefore leaves
no statement half-read on the connection, which stays usable for the next one.

Errors: a statement the server refuses raises
:class:`~bothy_notify.store.connection.StatementError` (its SQLSTATE and primary
message; the connection stays usable); a connection that fails raises
:class:`~bothy_notify.store.connection.StoreUnavailable`, one that does not
answer in time :class:`~bothy_notify.store.connection.StoreTimeout`; either
closes it, and the next statement connects again. So does a refusal that says the
server is not the primary any more (a write refused as read-only, SQLSTATE 25006:
:class:`~bothy_notify.store.connection.StoreUnavailable`). Each of these tells
:data:`~bothy_notify.store.servers.SERVERS` that the server is lost.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import trio
from psycopg import pq

from bothy_notify.store.connection import (
    DEFAULT_TIMEOUTS,
    BoundedConnection,
    DatabaseTimeouts,
    StatementError,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    connect_dedicated,
    refusal,
)
from bothy_notify.store.servers import SERVERS, not_the_primary


class DirectConnection:
    """One autocommit connection to ``url`` used from the Trio thread.

    One statement at a time (a lock orders callers). Connecting runs in a worker
    thread (``database.connect_timeout`` per host); every wait for the server's
    answer is bounded by ``database.response_timeout``.

    Args:
        url: the database URL (never logged).
        timeouts: the bounds (``[database]``).
        asynchronous_commit: its statements' commits return before their WAL is
            flushed (see :mod:`bothy_notify.store.connection`): for writes the
            daemon redoes after a server crash, never for appends.
    """

    def __init__(
        self,
        url: str,
        *,
        timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS,
        asynchronous_commit: bool = False,
    ) -> None:
        self._url = url
        self._timeouts = timeouts
        self._asynchronous_commit = asynchronous_commit
        self._conn: BoundedConnection | None = None
        self._prepared: set[bytes] = set()
        self._lock = trio.Lock()
        self._stale = False
        self.statements = 0
        """Statements run (statistics, tests)."""

    def __repr__(self) -> str:
        return f"DirectConnection(open={self._conn is not None})"

    async def query(
        self, name: bytes, sql: bytes, params: Sequence[bytes | None]
    ) -> list[list[bytes | None]]:
        """Run ``sql`` (prepared once per connection as ``name``) with text ``params``;
        returns the rows, each column as text (``None`` for NULL).

        Cancellation: before the statement is sent (waiting for the lock or the
        connection), it is delivered at once and nothing runs. Once sent, the
        statement's answer is waited for (at most ``database.response_timeout``
        per round trip) and its rows returned; the cancellation comes at the
        caller's next checkpoint.

        Raises:
            StatementError: the server refused the statement.
            StoreTimeout: the server did not answer in time (connection closed).
            StoreUnavailable: the connection could not be made or broke (closed).
        """
        async with self._lock:
            if self._stale:
                self._stale = False
                self._close()
            conn = self._conn
            if conn is None or conn.closed:
                made = await trio.to_thread.run_sync(
                    lambda: connect_dedicated(
                        self._url,
                        timeouts=self._timeouts,
                        asynchronous_commit=self._asynchronous_commit,
                    )
                )
                assert isinstance(made, BoundedConnection)
                conn = self._conn = made
                conn.pgconn.nonblocking = 1
                self._prepared = set()
                # Cancelled while connecting: deliver it before anything is sent.
                await trio.lowlevel.checkpoint_if_cancelled()
            with trio.CancelScope(shield=True):
                results = await self._exchange(conn.pgconn, name, sql, params)
            self.statements += 1
            rows: list[list[bytes | None]] = []
            for res in results:
                rows += [
                    [res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)
                ]
            return rows

    async def _exchange(
        self, pgconn: pq.abc.PGconn, name: bytes, sql: bytes, params: Sequence[bytes | None]
    ) -> list[pq.abc.PGresult]:
        """Prepare (once) and run the statement; every round trip bounded. Closes the
        connection when it fails or does not answer."""
        try:
            if name not in self._prepared:
                pgconn.send_prepare(name, sql)
                await self._results(pgconn)
                self._prepared.add(name)
            pgconn.send_query_prepared(name, params)
            return await self._results(pgconn)
        except StatementError:
            raise
        except BaseException as exc:
            conn, broke = self._conn, pgconn.status != pq.ConnStatus.OK
            self._close()
            if conn is not None and (
                broke or isinstance(exc, StoreTimeout) or not_the_primary(exc.__cause__ or exc)
            ):
                # Did not answer, broke, or is not the primary any more.
                SERVERS.lost(conn.server)
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, (psycopg.Error, OSError)):
                raise StoreUnavailable("the database cannot be reached") from exc
            raise

    async def _results(self, pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
        """Send what is queued, then read every result of the statement, within
        ``database.response_timeout``."""
        results: list[pq.abc.PGresult] = []
        error: StatementError | None = None
        bound = self._timeouts.response
        with trio.move_on_after(bound if bound is not None else float("inf")) as waited:
            while pgconn.flush():
                await trio.lowlevel.wait_writable(pgconn.socket)
            while True:
                pgconn.consume_input()
                while pgconn.is_busy():
                    await trio.lowlevel.wait_readable(pgconn.socket)
                    pgconn.consume_input()
                res = pgconn.get_result()
                if res is None:
                    break
                if res.status == pq.ExecStatus.FATAL_ERROR and error is None:
                    error = StatementError(
                        (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode(),
                        (res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"").decode(
                            errors="replace"
                        ),
                    )
                elif res.status == pq.ExecStatus.TUPLES_OK:
                    results.append(res)
        if waited.cancelled_caught:
            raise StoreTimeout("the database did not answer in time")
        if pgconn.status != pq.ConnStatus.OK:
            raise StoreUnavailable("the database connection broke")
        if error is not None:
            if not_the_primary(error):
                raise StoreUnavailable("the database server is not the primary") from error
            raise refusal(error)
        return results

    def reconnect(self) -> None:
        """Connect again before the next statement (its server stopped answering on
        another connection). A statement under way keeps its own bound."""
        self._stale = True

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """Close the connection (the next statement would open another). Waits for a
        statement under way (at most ``database.response_timeout``)."""
        async with self._lock:
            self._close()


__all__ = ["DirectConnection", "StatementError"]
