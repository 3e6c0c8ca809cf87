"""What every way to PostgreSQL shares: the store's errors, the bounds on every wait,
and how a connection is made.

Three ways lead to the server, and all of them come through here: the pools
(:class:`~bothy_notify.store.db.Database`, psycopg in worker threads), the
connection driven from the Trio thread (:mod:`bothy_notify.store.direct`), and
dedicated connections (the listeners, migrations, the commands).

Errors::

    StoreError                 the database could not do what was asked
    ├── StoreUnavailable       it could not be reached at all, or the connection broke
    │   └── StoreTimeout       it did not answer within database.response_timeout (a
    │                          frozen server): the connection was closed, the last
    │                          statement's outcome is unknown
    ├── StoreConflict          a uniqueness rule refused a concurrent write
    ├── StoreContention        a concurrent transaction got in the way: the same work
    │                          may simply be retried (SQLSTATE 40000 only: see below)
    └── StatementError         the server refused one statement of the direct
                               connection; its SQLSTATE says why (the connection stays)

Whatever psycopg counts as an ``OperationalError`` is :class:`StoreUnavailable`, on
both paths: a lost connection, too many connections, a server shutting down
(57P01-57P03), and also a statement the server cancelled (``statement_timeout``,
SQLSTATE 57014: the server could not do it in time; the connection stays) and, as
psycopg classes them, deadlocks and serialization failures (40P01, 40001). So is a
write refused as read-only (25006): the connection reached a server that is no
longer the primary (demoted after a failover); it is closed, and the caller's retry
goes to a new connection, which skips it.

Which server a connection reached, and which did not answer or are no longer the
primary, is :mod:`bothy_notify.store.servers`' to remember: a new connection tries
those last, and the first time one is found lost every pool drops its connections
(:class:`BoundedConnection` reports what it sees there). Every connection asks for
a server that takes writes (``target_session_attrs=read-write`` unless the URL says
otherwise): a standby, or a demoted primary, is skipped at once.

``store`` is the only package that knows psycopg's errors: :func:`translate_errors`
turns every ``psycopg.Error`` into one of these (``raise ... from exc``), once, at
the boundary, so callers catch :class:`StoreError` only.

Bounds (:class:`DatabaseTimeouts`, the ``[database]`` keys). A frozen server (its
processes stopped, a hung host, a network split) accepts TCP connections and
never answers, so every wait has a bound of its own:

=====================  ====================================================
connecting             ``connect_timeout`` per host of the URL (libpq's; a
                       multi-host URL moves on to the next host)
an established link    ``tcp_user_timeout`` and keepalives derived from it
                       (the kernel drops a peer that stops acknowledging)
a statement            ``statement_timeout`` on the server (a slow statement
                       ends cleanly), ``response_timeout`` in the client (a
                       server that does not answer at all): every wait for
                       the server's answer, in :class:`BoundedConnection`
=====================  ====================================================

Commits. A connection commits synchronously (PostgreSQL's default: the commit
returns once its WAL is flushed) unless it is opened with ``asynchronous_commit``
(``synchronous_commit = off`` for its session): then the commit returns at once
and the WAL writer flushes it within ``3 * wal_writer_delay``. A crash of the
server (not of the daemon) in between loses that commit, never a later one's
without it, and nothing that a synchronous commit made after it depends on (the
flush is cumulative). Only writes whose loss is redone by the daemon itself get
it: the consumer round's transaction (its events are read again and decided
again) and the completion of jobs (the job runs again at its lease's end), so a
crash costs at most a duplicate delivery, which the at-least-once contract
allows. An append never does: it is answered only once it is durable.

One rule for cancellation, on every path: a statement once sent is waited for.
A caller cancelled while its statement runs gets the statement's result (or
error) and the cancellation at its next checkpoint; the wait is bounded by
``response_timeout``, so a cancelled caller waits at most that. Nothing is
abandoned halfway and no connection is closed because its caller went away; a
connection is closed when it broke or did not answer (:class:`StoreTimeout`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, Self, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg_pool import PoolTimeout

from bothy_notify.store.servers import SERVERS, ServerKey, attempt_key, not_the_primary

T = TypeVar("T")
P = ParamSpec("P")
RV = TypeVar("RV")

Conn = psycopg.Connection[Any]


class StoreError(Exception):
    """The database refused or failed an operation."""


class StoreUnavailable(StoreError):
    """The database cannot be reached, or the connection broke."""


class StoreTimeout(StoreUnavailable):
    """The database did not answer within ``database.response_timeout``.

    The connection was closed: whether the statement under way took effect is
    unknown, as when a connection breaks.
    """


class StoreConflict(StoreError):
    """A uniqueness rule refused the write (another writer got there first)."""


class StoreContention(StoreError):
    """A concurrent transaction got in the way (deadlock, serialization failure).

    Nothing is wrong with the work itself: run it again.
    """


class StatementError(StoreError):
    """The server refused the statement; ``sqlstate`` and ``message`` say why (the
    message may quote values: never log it)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"the database refused the statement ({sqlstate})")
        self.sqlstate = sqlstate
        self.message = message


class NoAnswer(psycopg.OperationalError):
    """psycopg-level: the server did not answer one request in time (raised by
    :class:`BoundedConnection`, translated to :class:`StoreTimeout`)."""


@contextmanager
def translate_errors() -> Iterator[None]:
    """Translate psycopg's errors raised inside the block into :class:`StoreError`.

    A server that did not answer in time becomes :class:`StoreTimeout`, a lost or
    unreachable server, or one that is not the primary any more (a write refused
    as read-only), :class:`StoreUnavailable`, a unique violation
    :class:`StoreConflict`, a deadlock or serialization failure
    :class:`StoreContention`, anything else :class:`StoreError`. The message is
    constant (psycopg's may quote values or hosts); the cause is kept.
    """
    try:
        yield
    except NoAnswer as exc:
        raise StoreTimeout("the database did not answer in time") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
        if _unanswered(exc):
            raise StoreTimeout("the database did not answer in time") from exc
        raise StoreUnavailable("the database cannot be reached") from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise StoreUnavailable("the database server is not the primary") from exc
    except psycopg.errors.UniqueViolation as exc:
        raise StoreConflict("a concurrent write got there first") from exc
    except psycopg.errors.TransactionRollback as exc:
        raise StoreContention("a concurrent transaction got in the way") from exc
    except psycopg.Error as exc:
        raise StoreError(f"the database refused the operation ({type(exc).__name__})") from exc


def refusal(error: StatementError) -> StoreError:
    """What a statement the server refused raises on the direct connection: what
    :func:`translate_errors` makes of psycopg's error of the same SQLSTATE when that
    is :class:`StoreUnavailable` (a cancelled statement, too many connections, a
    server that is not the primary), else ``error`` itself, which carries the
    SQLSTATE and message."""
    try:
        kind = psycopg.errors.lookup(error.sqlstate)
    except KeyError:
        return error
    if issubclass(kind, psycopg.OperationalError | psycopg.errors.ReadOnlySqlTransaction):
        unavailable = StoreUnavailable("the database could not run the statement")
        unavailable.__cause__ = error
        return unavailable
    return error


def _unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` followed a :class:`NoAnswer` (leaving a transaction block on
    the closed connection raises an error of its own, whose context is the first)."""
    seen = exc.__context__
    while seen is not None:
        if isinstance(seen, NoAnswer):
            return True
        seen = seen.__context__
    return False


def translated(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with its psycopg errors translated (for work on dedicated connections)."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with translate_errors():
            return fn(*args, **kwargs)

    return wrapper


@dataclass(frozen=True, slots=True)
class DatabaseTimeouts:
    """The bound of every wait on PostgreSQL, in seconds (the ``[database]`` keys of
    the same names; the defaults are theirs, reasoned in docs/operations.md, "High
    availability").

    Attributes:
        connect: ``connect_timeout``: one connection attempt to one host (whole
            seconds, at least 2 as libpq counts).
        tcp_user: ``tcp_user_timeout``; keepalives are derived from it. 0: the
            kernel's defaults.
        statement: ``statement_timeout``, set on the server for every session the
            daemon opens. 0: none.
        response: ``response_timeout``: every wait for the server's answer, in the
            client. ``None``: unbounded (migrations and the operator's commands,
            which may legitimately run for minutes).
        listen_check: ``listen_check_interval``: an idle ``LISTEN`` connection
            checks its server this often.
        health_check: ``health_check_timeout``: ``/readyz``'s database check.
    """

    connect: float = 3.0
    tcp_user: float = 10.0
    statement: float = 5.0
    response: float | None = 6.0
    listen_check: float = 5.0
    health_check: float = 2.0

    def libpq(self) -> dict[str, Any]:
        """The libpq parameters of a connection: its connect timeout, keepalives and
        TCP user timeout (they override the same parameters given in the URL)."""
        params: dict[str, Any] = {"connect_timeout": max(2, math.ceil(self.connect))}
        if self.tcp_user > 0:
            params |= {"keepalives": 1, **self._keepalives("keepalives_")}
        return params

    def session(self) -> dict[str, str]:
        """The server settings of every session the daemon opens: its statements'
        limit, and the same TCP bounds on the server's side of the connection, so
        that the server ends a session whose client went silent (its locks, the
        round's advisory lock among them, are then free for another node)."""
        settings: dict[str, str] = {}
        if self.statement > 0:
            settings["statement_timeout"] = f"{max(1, round(self.statement * 1000))}ms"
        if self.tcp_user > 0:
            settings |= {k: str(v) for k, v in self._keepalives("tcp_keepalives_").items()}
        return settings

    def _keepalives(self, prefix: str) -> dict[str, int]:
        # Idle half the bound before the first probe, then one every sixth: a silent
        # peer is given up after about the bound (with tcp_user_timeout set, the
        # kernel decides by it when keepalive probes go unanswered).
        return {
            f"{prefix}idle": max(1, int(self.tcp_user / 2)),
            f"{prefix}interval": max(1, int(self.tcp_user / 6)),
            f"{prefix}count": 3,
            "tcp_user_timeout": max(1, round(self.tcp_user * 1000)),
        }

    def unbounded_statements(self) -> DatabaseTimeouts:
        """The same connection bounds without a statement or response bound (for
        migrations and the operator's commands)."""
        return DatabaseTimeouts(
            connect=self.connect,
            tcp_user=self.tcp_user,
            statement=0.0,
            response=None,
            listen_check=self.listen_check,
            health_check=self.health_check,
        )


DEFAULT_TIMEOUTS = DatabaseTimeouts()
"""The ``[database]`` defaults (tests, benchmarks; the daemon passes its configuration's)."""

UNBOUNDED_STATEMENTS = DEFAULT_TIMEOUTS.unbounded_statements()
"""Connecting bounded, statements not: what :func:`connect_dedicated` uses unless told
(migrations and the operator's commands may legitimately run for minutes, and the
operator can interrupt them)."""

BULK_TIMEOUT = 300.0
"""Seconds the server may take for one statement of bulk work (the hourly sweep's
prunes, :meth:`Database.run <bothy_notify.store.db.Database.run>` with ``bulk``): an
hour's finished jobs on a large installation fit, and a frozen server holds the
sweep, in the background, no longer than this."""


OPTIONS = ("autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory")
"""Arguments of psycopg's ``Connection.connect`` that are not libpq parameters."""


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded, and which
    tells :data:`~bothy_notify.store.servers.SERVERS` what it finds.

    psycopg funnels every wait for the server's answer (a statement, a commit, a
    rollback, fetching) through :meth:`wait`; here it gets
    ``database.response_timeout`` as its timeout. Past it the server counts as
    lost: the connection is closed (a pool discards it when it comes back),
    the server noted lost, and :class:`NoAnswer` raised, which
    :func:`translate_errors` makes :class:`StoreTimeout`.

    :meth:`connect` tries the URL's hosts one at a time, each bounded by libpq's
    ``connect_timeout``, the hosts found lost last; a host that timed out is noted
    lost, the one that answered found again. It asks for a server that takes
    writes unless the URL names ``target_session_attrs``.
    """

    _response_timeout: float | None = None
    unanswered = False
    """Closed because the server did not answer in time."""
    server: ServerKey = ("", "")
    """The server this connection reached (:mod:`bothy_notify.store.servers`)."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        """Connect to the first host of ``conninfo`` that answers and takes writes,
        trying the hosts found lost last. Blocking: ``connect_timeout`` per host.

        Raises:
            psycopg.OperationalError: no host could be connected to (the last
                host's error).
        """
        options = {name: kwargs.pop(name) for name in OPTIONS if name in kwargs}
        params = conninfo_to_dict(conninfo, **kwargs)
        params.setdefault("target_session_attrs", "read-write")
        failure: psycopg.OperationalError | None = None
        for attempt in SERVERS.attempts(conninfo_attempts(params)):
            key = attempt_key(attempt)
            try:
                conn = super().connect(make_conninfo("", **attempt), **options)
            except psycopg.errors.ConnectionTimeout as exc:
                SERVERS.lost(key)  # accepts TCP, never answers: a frozen host
                failure = exc
                continue
            except psycopg.OperationalError as exc:
                failure = exc  # refused, or not a server that takes writes: the next
                continue
            conn.server = key
            SERVERS.connected(key)
            return conn
        assert failure is not None  # conninfo_attempts gives one attempt at least
        raise failure

    def bound_responses(self, seconds: float | None) -> None:
        """Bound every later wait for the server to ``seconds`` (``None``: unbounded)."""
        self._response_timeout = seconds

    @contextmanager
    def responses_within(self, seconds: float | None) -> Iterator[None]:
        """Within the block, waits are bounded by ``seconds`` instead (``None``: keep
        the connection's bound). Bulk work allows more than a request does."""
        if seconds is None:
            yield
            return
        before, self._response_timeout = self._response_timeout, seconds
        try:
            yield
        finally:
            self._response_timeout = before

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        bound = self._response_timeout
        if timeout is not None or bound is None:
            # A caller with a timeout of its own (psycopg's notifies) handles it.
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, bound)
        except psycopg.errors._WaitTimeout as exc:
            # The request's state is unknown: nothing more may be sent on this link.
            self.unanswered = True
            self.pgconn.finish()
            SERVERS.lost(self.server)
            raise NoAnswer("the server did not answer in time") from exc

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Around work on this connection: an error that says its server is not the
        primary any more (:func:`~bothy_notify.store.servers.not_the_primary`), or a
        connection that broke, notes the server lost; a connection to a server that
        is not the primary is closed, so that no one uses it again (a pool replaces
        it). The error passes on."""
        try:
            yield
        except psycopg.Error as exc:
            demoted = not_the_primary(exc)
            if demoted or self.broken:
                SERVERS.lost(self.server)
            if demoted and not self.closed:
                self.close()
            raise


def configure(
    conn: BoundedConnection, timeouts: DatabaseTimeouts, *, asynchronous_commit: bool = False
) -> None:
    """Give a new connection its bounds: the response bound in the client and, on the
    server, the session's settings (:meth:`DatabaseTimeouts.session`, and
    ``synchronous_commit = off`` with ``asynchronous_commit``: see the module's
    docstring). Blocking.

    Set by one statement rather than the ``options`` startup parameter, which
    PgBouncer refuses. Leaves the connection idle (commits when not autocommit).
    """
    conn.bound_responses(timeouts.response)
    settings = timeouts.session()
    if asynchronous_commit:
        settings["synchronous_commit"] = "off"
    if settings:
        calls = ", ".join("set_config(%s, %s, false)" for _ in settings)
        conn.execute(f"SELECT {calls}", [v for kv in settings.items() for v in kv])
        if not conn.autocommit:
            conn.commit()


def connect(
    url: str,
    timeouts: DatabaseTimeouts,
    *,
    autocommit: bool = True,
    asynchronous_commit: bool = False,
) -> Conn:
    """A new connection to ``url`` with ``timeouts``; psycopg's errors are the caller's
    to translate. Blocking: at most ``connect`` seconds per host of the URL, and one
    statement (``statement_timeout``) bounded by ``response``. ``asynchronous_commit``:
    see the module's docstring."""
    conn = BoundedConnection.connect(url, autocommit=autocommit, **timeouts.libpq())
    try:
        with conn.watching():
            configure(conn, timeouts, asynchronous_commit=asynchronous_commit)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_dedicated(
    url: str,
    *,
    autocommit: bool = True,
    timeouts: DatabaseTimeouts = UNBOUNDED_STATEMENTS,
    asynchronous_commit: bool = False,
) -> Conn:
    """A connection outside the pool (a listener, migrations, a command); autocommit
    by default, so explicit ``conn.transaction()`` blocks are the only transactions.
    The daemon's own (listeners, the direct connection) pass their ``timeouts``;
    without, statements are unbounded (:data:`UNBOUNDED_STATEMENTS`). Its commits
    are synchronous unless ``asynchronous_commit`` (see the module's docstring).

    Raises:
        StoreError: the database cannot be reached (:class:`StoreUnavailable`) or
            refused the session's settings.
    """
    with translate_errors():
        return connect(
            url, timeouts, autocommit=autocommit, asynchronous_commit=asynchronous_commit
        )


def connection_limit(url: str, *, timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS) -> int:
    """Connections the server at ``url`` lets ordinary roles open: ``max_connections``
    minus those reserved for superusers. Blocking.

    Raises:
        StoreError: the database cannot be reached.
    """
    with translate_errors():
        conn = connect(url, timeouts)
        try:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
            ).fetchone()
        finally:
            conn.close()
    assert row is not None
    return int(row[0])


__all__ = [
    "BULK_TIMEOUT",
    "DEFAULT_TIMEOUTS",
    "UNBOUNDED_STATEMENTS",
    "BoundedConnection",
    "Conn",
    "DatabaseTimeouts",
    "NoAnswer",
    "StatementError",
    "StoreConflict",
    "StoreContention",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "configure",
    "connect",
    "connect_dedicated",
    "connection_limit",
    "refusal",
    "translate_errors",
    "translated",
]
