"""A connection driven from the Trio thread: a statement without a worker thread.

:meth:`Database.run <bothy_notify.store.db.Database.run>` runs blocking psycopg
in a worker thread. Each call is two hand-overs between threads, and on a busy
machine each costs a scheduling round trip, taken while the GIL is held (a
woken thread preempts the one that woke it): on the public path at 200
events/s that was most of a ``POST /v1/events`` (docs/performance.md,
"public path"). :class:`DirectConnection` instead puts libpq in non-blocking
mode and waits on its socket with Trio, so a statement costs what libpq and
the server cost. It runs one prepared statement at a time, with text
parameters and text results; it is for short statements of the hot path (the
HTTP API's appends), everything else stays on the pool.

Errors: a statement the server refuses raises :class:`StatementError` (its
SQLSTATE and primary message; the connection stays usable); a connection that
fails raises :class:`~bothy_notify.store.db.StoreUnavailable` and is closed,
and the next statement connects again.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import trio
from psycopg import pq

from bothy_notify.store.db import Conn, StoreError, StoreUnavailable, connect_dedicated


class StatementError(StoreError):
    """The server refused the statement; ``sqlstate`` and ``message`` say why (the
    message may quote values: never log it)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"the database refused the statement ({sqlstate})")
        self.sqlstate = sqlstate
        self.message = message


class DirectConnection:
    """One autocommit connection to ``url`` used from the Trio thread.

    One statement at a time (a lock orders callers). Cancellation while a
    statement runs closes the connection (its state is unknown); the statement
    itself may have committed, as with a connection lost mid-statement.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Conn | None = None
        self._prepared: set[bytes] = set()
        self._lock = trio.Lock()
        self.statements = 0
        """Statements run (statistics, tests)."""

    def __repr__(self) -> str:
        return f"DirectConnection(open={self._conn is not None})"

    async def query(
        self, name: bytes, sql: bytes, params: Sequence[bytes | None]
    ) -> list[list[bytes | None]]:
        """Run ``sql`` (prepared once per connection as ``name``) with text ``params``;
        returns the rows, each column as text (``None`` for NULL)."""
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                conn = self._conn = await trio.to_thread.run_sync(connect_dedicated, self._url)
                conn.pgconn.nonblocking = 1
                self._prepared = set()
            try:
                if name not in self._prepared:
                    conn.pgconn.send_prepare(name, sql)
                    await self._results(conn.pgconn)
                    self._prepared.add(name)
                conn.pgconn.send_query_prepared(name, params)
                results = await self._results(conn.pgconn)
            except StatementError:
                raise
            except BaseException as exc:
                self._close()
                if isinstance(exc, (psycopg.Error, OSError)):
                    raise StoreUnavailable("the database cannot be reached") from exc
                raise
            self.statements += 1
            rows: list[list[bytes | None]] = []
            for res in results:
                rows += [
                    [res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)
                ]
            return rows

    async def _results(self, pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
        """Send what is queued, then read every result of the statement."""
        while pgconn.flush():
            await trio.lowlevel.wait_writable(pgconn.socket)
        results: list[pq.abc.PGresult] = []
        error: StatementError | None = None
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
        if pgconn.status != pq.ConnStatus.OK:
            raise StoreUnavailable("the database connection broke")
        if error is not None:
            raise error
        return results

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """Close the connection (the next statement would open another)."""
        async with self._lock:
            self._close()
