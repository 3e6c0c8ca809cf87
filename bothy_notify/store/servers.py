"""Which servers of the database URL answer: what this process learnt, shared by
every way to PostgreSQL.

A multi-host URL (``host=pg1,pg2,pg3``, ``target_session_attrs=read-write``) is
tried host by host, and libpq alone starts from the first every time. After a
failover that costs: a frozen host ahead in the list (its processes stopped, a
hung host, a split: it accepts TCP and never answers) costs every new
connection ``database.connect_timeout``, a pool reconnecting one connection at a
time pays it per connection, and a connection already open to the frozen server
(say, in a pool nobody used during the outage) costs its next caller
``database.response_timeout`` and puts its pool back into failing fast.

:class:`ServerWatch` remembers the servers found lost, and acts on it at once:

- **Lost** is a server that did not answer (a statement past
  ``response_timeout``, a connection attempt past ``connect_timeout``), or that
  is no longer the primary: a write refused as read-only (SQLSTATE 25006, a
  demoted server), a connection it ended or that broke (57P01-57P03, class 08).
- **Tried last**: new connections try the hosts of the URL in their order with
  the lost ones moved to the end (:meth:`ServerWatch.attempts`), so after a
  failover the new primary answers first. A lost host is still tried: when it is
  the only one that takes writes, it is reached after the others refused.
- **Dropped everywhere**: the first time a server is found lost, every pool and
  direct connection of the process drops its connections (the callbacks of
  :meth:`ServerWatch.on_lost`), at once rather than one failed caller each.
- **Forgiven** when a connection to it succeeds (:meth:`ServerWatch.connected`).

The process's one watch is :data:`SERVERS`: what one connection learns about a
server holds for all the others (the three pools, their direct connections, the
listeners), as a route does. Callable from any thread.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

ServerKey = tuple[str, str]
"""A server as a connection reaches it: (address or host or socket directory, port)."""

NOT_PRIMARY_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
"""SQLSTATEs that say this server is not (or no longer) the primary the daemon writes to:
read_only_sql_transaction (a demoted server, or a standby), admin_shutdown,
crash_shutdown, cannot_connect_now (it is restarting, as Patroni restarts a demoted
primary). Class 08 (connection exception) counts too (:func:`not_the_primary`)."""


def not_the_primary(exc: BaseException) -> bool:
    """Whether ``exc`` (a psycopg error) says its server is not the primary to write to
    any more: :data:`NOT_PRIMARY_SQLSTATES`, or a connection exception (class 08)."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate in NOT_PRIMARY_SQLSTATES or sqlstate.startswith("08")


def attempt_key(attempt: dict[str, Any]) -> ServerKey:
    """The server of one connection attempt (one host of the URL)."""
    host = str(attempt.get("hostaddr") or attempt.get("host") or "")
    port = str(attempt.get("port") or os.environ.get("PGPORT") or "5432")
    return host, port


def connection_key(conn: psycopg.Connection[Any]) -> ServerKey:
    """The server ``conn`` is connected to (read while it is open)."""
    info = conn.info
    return str(info.hostaddr or info.host or ""), str(info.port)


class ServerWatch:
    """The servers found lost, and who to tell (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lost: set[ServerKey] = set()
        self._callbacks: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._connections = 0

    def __repr__(self) -> str:
        return f"ServerWatch(lost={len(self._lost)})"

    def attempts(self, attempts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``attempts`` (one per host, in the URL's order) with the lost servers last,
        in their order."""
        with self._lock:
            lost = set(self._lost)
        return sorted(attempts, key=lambda attempt: attempt_key(attempt) in lost)

    def lost(self, key: ServerKey) -> bool:
        """Note that the server ``key`` did not answer or is not the primary. The first
        time (until a connection to it succeeds), every callback of :meth:`on_lost`
        runs (in this thread). Returns whether it was news."""
        with self._lock:
            if key in self._lost:
                return False
            self._lost.add(key)
            callbacks = [ref() for ref in self._callbacks]
            self._callbacks = [ref for ref in self._callbacks if ref() is not None]
        for callback in callbacks:
            if callback is not None:
                callback()
        return True

    def connected(self, key: ServerKey) -> None:
        """A connection to ``key`` succeeded: it answers (and takes writes) again."""
        with self._lock:
            self._lost.discard(key)
            self._connections += 1

    def forget(self) -> None:
        """Forget every server found lost (tests: a new proxy may reuse a port)."""
        with self._lock:
            self._lost.clear()

    def is_lost(self, key: ServerKey) -> bool:
        with self._lock:
            return key in self._lost

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever a server is newly found lost (a bound method:
        held weakly, so its object may go)."""
        with self._lock:
            self._callbacks.append(weakref.WeakMethod(callback))

    @property
    def connections(self) -> int:
        """Connections made since the watch was made (any server): a reconnecting
        listener may try again at once when another part of the process connected."""
        return self._connections


SERVERS = ServerWatch()
"""This process's watch: every connection the store makes consults and informs it."""


__all__ = [
    "NOT_PRIMARY_SQLSTATES",
    "SERVERS",
    "ServerKey",
    "ServerWatch",
    "attempt_key",
    "connection_key",
    "not_the_primary",
]
