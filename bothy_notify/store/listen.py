"""The store's listener: one dedicated connection that ``LISTEN``\\s, kept up.

Three services wait for PostgreSQL notifications: the consumer round
(``bothy_events``), the job runner (``bothy_jobs``) and the gateway's
revocation listener (revoked devices, deactivated people, replaced
connections). Each owns one :class:`Listener`; the listener owns everything
the three have in common::

    Listener.run(serve)                              until cancelled
    ├── connect (dedicated, autocommit)              psycopg errors -> StoreError
    ├── serve(listening)                             the service's own loop, with
    │   ├── [what must come first: the round's lock] the connection in hand
    │   ├── listening.listen()                       LISTEN each channel, then
    │   │   ├── task_status.started()                (first connection only)
    │   │   └── catch_up(listening)                  every connection: what was missed
    │   └── listening.wait() / wait_then(fn)         notifications; fn runs on the
    │                                                connection in the same thread call
    └── StoreError: warning (type only), close, wait (one Backoff), connect again

Rules:

- **Started means listening.** ``task_status.started()`` is called once
  ``LISTEN`` is in effect on every channel: a ``NOTIFY`` sent after it is
  received. (A service that first waits for something else, the round's
  standby waiting for its lock, says so with :meth:`Listening.standing_by`:
  it has nothing to listen to until it holds the lock.)
- **Catch-up after every (re)connection.** A notification sent while nobody
  listened is never delivered, so after each ``LISTEN`` the listener calls
  the service's ``catch_up`` hook: the runner peeks at due jobs, the
  revocation listener asks which connected devices are revoked (and, in a
  cluster, replaced), the round runs a round.
- **One backoff.** Between reconnection attempts the listener waits
  :func:`reconnect_backoff`: ``notify.poll_interval`` doubling to 5 s, back to
  the start on every successful connection (:mod:`bothy_notify.kernel.backoff`);
  it tries at once when another connection of the process got through meanwhile
  (:mod:`bothy_notify.store.servers`: after a failover, the new primary answers).
- **Errors translated once.** Every call on the connection runs through
  :func:`~bothy_notify.store.db.translated`: ``serve`` and the hooks see
  :class:`~bothy_notify.store.db.StoreError` only. A ``StoreError`` out of
  ``serve`` (the connection broke, a statement failed) reconnects; any other
  exception (a bug) ends :meth:`Listener.run` for its supervisor to restart.
- **A silent server is noticed.** Every wait for the server's answer is
  bounded by ``database.response_timeout``, and a connection that received
  nothing for ``database.listen_check_interval`` sends an empty query (in the
  same worker-thread wait): a frozen server, which keeps the socket open and
  never answers, is taken for lost within the two, and the listener
  reconnects (a multi-host URL: to whichever host now takes writes).
- **Cancellation is seen at once.** A wait runs in a worker thread that polls
  the connection's socket and a wake-up pipe; cancelling the waiting task
  writes to the pipe (the thread's abort hook), so the wait returns without
  a time slice. Work on the connection (a transaction, the round in
  :meth:`Listening.wait_then`) is never abandoned: it finishes, then the
  cancellation is delivered. The connection is closed in a shielded cleanup.

The round waits and runs in one worker-thread call (:meth:`Listening.wait_then`):
a notification starts the round without a hop through Trio, on the connection
that holds the round's advisory lock.

**A nudge from this process.** :meth:`Listener.nudge` ends a wait as a
notification would (with ``[]``), through a second pipe that the wait polls
beside the socket, without the database: the HTTP API wakes a round held in its
own process so (``store.appender``) instead of a ``NOTIFY``, which PostgreSQL
signals to every listening backend of the database. A nudge that comes while
no wait runs ends the next one at once: none is lost between two waits.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import select
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from bothy_notify.kernel.backoff import Backoff
from bothy_notify.kernel.supervise import error_type
from bothy_notify.store.connection import (
    DEFAULT_TIMEOUTS,
    Conn,
    DatabaseTimeouts,
    StoreError,
    connect_dedicated,
    translated,
)
from bothy_notify.store.servers import SERVERS

if TYPE_CHECKING:
    from outcome import Outcome

log = logging.getLogger("bothy.store.listen")

T = TypeVar("T")

RECONNECT_CAP = 5.0
"""Longest wait (seconds) between reconnection attempts while the database is away;
the first is ``notify.poll_interval`` (or this, when the poll interval is longer)."""

BACKOFF_CHECK = 0.1
"""Seconds between looks, while a listener waits to reconnect, at whether another
connection of the process got through (then it tries at once)."""

_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A channel name that ``LISTEN`` takes unquoted (the names are constants of the
store's modules; the statement's text stays ``LISTEN name``)."""

_INTERRUPTED: Any = object()
"""What a wait returns when the wake-up pipe ended it (its task was cancelled)."""


def reconnect_backoff(poll_interval: float) -> Backoff:
    """The reconnection backoff: ``poll_interval`` doubling to :data:`RECONNECT_CAP`."""
    return Backoff(initial=poll_interval, cap=max(poll_interval, RECONNECT_CAP))


@dataclass(frozen=True, slots=True)
class Notification:
    """One ``NOTIFY`` as received: its channel and payload (text the sender chose)."""

    channel: str
    payload: str

    def __repr__(self) -> str:  # a payload may name a person or a device
        return f"Notification({self.channel!r})"


@dataclass(frozen=True, slots=True)
class ListenerStatistics:
    """A snapshot of a :class:`Listener` (tests, debugging).

    ``connected``: a connection is open; ``listening``: ``LISTEN`` is in effect on
    it; ``connections``: connections made since the listener was made;
    ``failures``: connections lost or attempts failed (each a store error) since
    then; ``reconnect_wait``: seconds of the wait under way before the next
    attempt (``None``: not waiting).
    """

    connected: bool
    listening: bool
    connections: int
    failures: int
    reconnect_wait: float | None


CatchUp = Callable[["Listening"], Awaitable[None]]
Serve = Callable[["Listening"], Awaitable[None]]


class Listener:
    """One dedicated ``LISTEN`` connection, reconnected after every loss.

    Args:
        url: the database URL (never logged).
        channels: the channels to listen on (constant names, see :data:`_CHANNEL`).
        name: the service, in logs (a constant: ``round``, ``runner``, ``revocations``).
        reconnect: the backoff between reconnection attempts
            (:func:`reconnect_backoff` of ``notify.poll_interval``).
        catch_up: called after ``LISTEN`` on every connection, the first included,
            with the connection in hand: what the service may have missed. Not
            called for a service that never listens on a connection.
        timeouts: the bounds of its connection's waits (``[database]``).
        asynchronous_commit: its connection's commits return before their WAL is
            flushed (the round's transactions, which the round redoes after a
            server crash; see :mod:`bothy_notify.store.connection`).

    Raises:
        ValueError: a channel name ``LISTEN`` would need quoted.
    """

    def __init__(
        self,
        url: str,
        channels: Sequence[str],
        *,
        name: str,
        reconnect: Backoff,
        catch_up: CatchUp | None = None,
        timeouts: DatabaseTimeouts = DEFAULT_TIMEOUTS,
        asynchronous_commit: bool = False,
    ) -> None:
        for channel in channels:
            if not _CHANNEL.fullmatch(channel):
                raise ValueError("listener channel must be a lower-case identifier")
        self._url = url
        self.channels = tuple(channels)
        self.name = name
        self._reconnect = reconnect
        self._catch_up = catch_up
        self._timeouts = timeouts
        self._asynchronous_commit = asynchronous_commit
        self._limiter = trio.CapacityLimiter(1)
        self._task_status: trio.TaskStatus[None] | None = None
        self._wake: tuple[int, int] | None = None
        self._interrupted = False
        self._nudge: tuple[int, int] | None = None
        self._listening: Listening | None = None
        self._connections = 0
        self._failures = 0
        self._reconnect_wait: float | None = None

    def __repr__(self) -> str:
        return f"Listener({self.name!r}, connected={self.connected})"

    @property
    def connected(self) -> bool:
        """A connection is open (``LISTEN`` may not be in effect yet)."""
        return self._listening is not None

    def statistics(self) -> ListenerStatistics:
        listening = self._listening
        return ListenerStatistics(
            connected=listening is not None,
            listening=listening is not None and listening.listening,
            connections=self._connections,
            failures=self._failures,
            reconnect_wait=self._reconnect_wait,
        )

    async def run(
        self, serve: Serve, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect and hand the connection to ``serve``; reconnect whenever it is lost.

        ``serve(listening)`` is the service's loop while connected: it calls
        :meth:`Listening.listen` (or :meth:`Listening.standing_by`) and then
        waits. A :class:`StoreError` out of it (or out of connecting) closes
        the connection, waits the backoff and connects again; anything else
        ends this (its supervisor restarts it). Returns when ``serve`` returns.

        ``task_status.started()`` once ``LISTEN`` is in effect on the first
        connection (see the module docstring). Cancellation: a wait ends at
        once, work on the connection first finishes; the connection is closed
        in a shielded cleanup.
        """
        self._task_status = task_status
        retries = self._reconnect.retries()
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._wake, self._interrupted = (read_end, write_end), False
        nudge_read, nudge_write = os.pipe()
        os.set_blocking(nudge_read, False)
        os.set_blocking(nudge_write, False)
        self._nudge = (nudge_read, nudge_write)
        try:
            while True:
                listening: Listening | None = None
                try:
                    conn, pid, fd = await trio.to_thread.run_sync(
                        translated(_connect),
                        self._url,
                        self._timeouts,
                        self._asynchronous_commit,
                        limiter=self._limiter,
                    )
                    listening = self._listening = Listening(
                        self, conn, pid, fd, read_end, nudge_read
                    )
                    self._connections += 1
                    retries.succeeded()
                    await serve(listening)
                    return
                except StoreError as exc:
                    self._failures += 1
                    wait = retries.failed()
                    log.warning(
                        "a listener lost its database connection; reconnecting",
                        extra={
                            "listener": self.name,
                            "error_type": error_type(exc),
                            "retry_in_seconds": wait,
                        },
                    )
                finally:
                    self._listening = None
                    if listening is not None:
                        with trio.CancelScope(shield=True):
                            await listening.close()
                self._reconnect_wait = wait
                try:
                    await _back_off(wait)
                finally:
                    self._reconnect_wait = None
        finally:
            self._wake = self._nudge = None
            for end in (read_end, write_end, nudge_read, nudge_write):
                os.close(end)

    def _started(self) -> None:
        status, self._task_status = self._task_status, None
        if status is not None:
            status.started()

    def nudge(self) -> None:
        """End the current wait as a notification would, or the next one at once if
        none runs (any thread; it never blocks). Nothing while :meth:`run` is not
        running."""
        if self._nudge is not None:
            # A full pipe holds a nudge already: the next wait ends at once anyway.
            with contextlib.suppress(BlockingIOError):
                os.write(self._nudge[1], b"!")

    def _interrupt(self) -> None:
        """Wake a wait under way (called in the Trio thread when its task is cancelled)."""
        if self._wake is None or self._interrupted:
            return
        self._interrupted = True
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake[1], b"!")

    def _drain_wake(self) -> None:
        """Take back an earlier wake-up before the next wait (Trio thread)."""
        if self._interrupted and self._wake is not None:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._wake[0], 64):
                    pass
            self._interrupted = False


class Listening:
    """The listener's connection while it is up: what ``serve`` works with.

    Every call runs in the listener's worker thread (one at a time) with
    psycopg's errors translated to :class:`StoreError`.
    """

    def __init__(
        self, listener: Listener, conn: Conn, pid: int, fd: int, wake_fd: int, nudge_fd: int
    ) -> None:
        self._listener = listener
        self._conn = conn
        self.listening = False
        self.backend_pid = pid
        """The server process of this connection (tests end it with
        ``pg_terminate_backend``)."""
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._poller.register(wake_fd, select.POLLIN)
        self._poller.register(nudge_fd, select.POLLIN)
        self._wake_fd = wake_fd
        self._nudge_fd = nudge_fd

    def __repr__(self) -> str:
        return f"Listening({self._listener.name!r}, listening={self.listening})"

    async def listen(self) -> None:
        """``LISTEN`` on every channel of the listener, report started (the first
        time), then call the listener's ``catch_up`` hook.

        Raises:
            StoreError: the connection broke (the listener reconnects).
        """
        await self.run(_listen, self._listener.channels)
        self.listening = True
        self._listener._started()
        if self._listener._catch_up is not None:
            await self._listener._catch_up(self)

    def standing_by(self) -> None:
        """Report started without listening yet: the service waits for something
        else first (the round's standby, for the round's lock) and calls
        :meth:`listen` once it has it."""
        self._listener._started()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on the connection, in the worker thread (blocking work:
        a transaction, a lock attempt). Cancellation waits for it to finish.

        Raises:
            StoreError: psycopg's errors, translated.
        """
        result: T = await trio.to_thread.run_sync(
            translated(fn), self._conn, *args, limiter=self._listener._limiter
        )
        return result

    async def wait(self, at_most: float | None = None) -> list[Notification]:
        """The notifications that arrive within ``at_most`` seconds (``None``: wait
        until one does; ``0``: only those already received). Returns as soon as
        one arrives, with every one received so far; ``[]`` when the time ran out
        (a fallback poll, not a failure: hence no cancel scope) or the listener
        was nudged (:meth:`Listener.nudge`).

        Cancellation: the wait ends at once.

        Raises:
            StoreError: the connection broke.
        """
        return await self.wait_then(_notifications, at_most)

    async def wait_then(
        self, fn: Callable[[Conn, list[Notification]], T], at_most: float | None = None
    ) -> T:
        """Wait as :meth:`wait` does, then run ``fn(conn, notifications)`` (the
        notifications may be ``[]``: the time ran out) in the same worker-thread
        call: a notification starts ``fn`` without a hop through Trio.

        Cancellation: a wait ends at once and ``fn`` is not run; once ``fn`` has
        begun it finishes (it may be a transaction), then the cancellation is
        delivered.

        Raises:
            StoreError: the connection broke, or ``fn`` raised it (psycopg's
            errors translated); whatever else ``fn`` raises passes unchanged.
        """
        deadline = None if at_most is None else time.monotonic() + at_most
        while True:
            result = await self._interruptible(
                translated(partial(self._wait_then_sync, fn, deadline))
            )
            if result is not _INTERRUPTED:
                return result
            # Woken for a cancellation: deliver it; if it was withdrawn meanwhile,
            # wait on for what is left of the time.
            await trio.lowlevel.checkpoint()

    def _wait_then_sync(
        self, fn: Callable[[Conn, list[Notification]], T], deadline: float | None
    ) -> T:
        """Blocking: the wait, then ``fn`` (see :meth:`wait_then`)."""
        got = _wait_for_notifications(
            self._conn,
            self._poller,
            self._wake_fd,
            self._nudge_fd,
            deadline,
            self._listener._timeouts.listen_check,
        )
        if got is None:
            return _INTERRUPTED  # type: ignore[no-any-return]
        return fn(self._conn, got)

    async def _interruptible(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread; cancelling the caller wakes the wait in it.

        :func:`trio.to_thread.run_sync` has no hook for a cancellation that the
        thread should hear about; its lower-level pieces do: the abort hook of
        :func:`trio.lowlevel.wait_task_rescheduled` writes to the wake-up pipe and
        refuses the abort, so the thread's result (or exception) still comes back.
        """
        listener = self._listener
        async with listener._limiter:
            await trio.lowlevel.checkpoint_if_cancelled()
            listener._drain_wake()
            task = trio.lowlevel.current_task()
            token = trio.lowlevel.current_trio_token()

            def deliver(result: Outcome[T]) -> None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(trio.lowlevel.reschedule, task, result)

            def abort(_: object) -> trio.lowlevel.Abort:
                listener._interrupt()
                return trio.lowlevel.Abort.FAILED

            trio.lowlevel.start_thread_soon(fn, deliver, name=f"listener {listener.name}")
            result: T = await trio.lowlevel.wait_task_rescheduled(abort)
            return result

    async def close(self) -> None:
        """Close the connection (the listener does, after ``serve``)."""
        self.listening = False
        await trio.to_thread.run_sync(self._conn.close, limiter=self._listener._limiter)


def delivering(on_notify: Callable[[list[Notification]], None]) -> Serve:
    """A ``serve`` for :meth:`Listener.run` that listens and hands every batch of
    notifications to ``on_notify`` (in the Trio thread, as they arrive)."""

    async def serve(listening: Listening) -> None:
        await listening.listen()
        while True:
            on_notify(await listening.wait())

    return serve


async def _back_off(wait: float) -> None:
    """Wait ``wait`` seconds before the next connection attempt, or less: until
    another connection of the process succeeds (:data:`~bothy_notify.store.servers.SERVERS`),
    a sign that the database, or a new primary, answers again."""
    seen = SERVERS.connections
    end = trio.current_time() + wait
    while SERVERS.connections == seen:
        left = end - trio.current_time()
        if left <= 0:
            return
        await trio.sleep(min(BACKOFF_CHECK, left))


def _connect(
    url: str, timeouts: DatabaseTimeouts, asynchronous_commit: bool
) -> tuple[Conn, int, int]:
    """Blocking: a dedicated connection, its server process id and its socket."""
    conn = connect_dedicated(url, timeouts=timeouts, asynchronous_commit=asynchronous_commit)
    try:
        return conn, conn.info.backend_pid, conn.fileno()
    except BaseException:
        conn.close()
        raise


def _listen(conn: Conn, channels: Sequence[str]) -> None:
    # One statement per channel: the server shows each as ``LISTEN name``.
    for channel in channels:
        conn.execute(f"LISTEN {channel}")


def _notifications(_conn: Conn, got: list[Notification]) -> list[Notification]:
    return got


def _wait_for_notifications(
    conn: Conn,
    poller: select.poll,
    wake_fd: int,
    nudge_fd: int,
    deadline: float | None,
    check_every: float,
) -> list[Notification] | None:
    """Blocking: the notifications received by ``deadline`` (``time.monotonic()``;
    ``None``: no limit), as soon as there is one; ``[]`` when the deadline passed or
    ``nudge_fd`` became readable (it is drained first, so a nudge after this returns
    ends the next wait); ``None`` when ``wake_fd`` became readable first (the
    waiting task was cancelled).

    Notifications that came in while the connection ran other statements are
    already read (psycopg keeps them) and are returned at once. After
    ``check_every`` seconds without a message from the server, an empty query
    checks that it still answers (bounded by ``database.response_timeout``: a
    frozen server raises, translated by the caller).
    """
    check_at = time.monotonic() + check_every
    while True:
        got = [Notification(n.channel, n.payload) for n in conn.notifies(timeout=0)]
        if got:
            return got
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            return []
        if check_at <= now:
            conn.execute("")
            check_at = time.monotonic() + check_every
            continue
        until = check_at if deadline is None else min(deadline, check_at)
        ready = poller.poll(math.ceil((until - now) * 1000))
        nudged = False
        for fd, _ in ready:
            if fd == wake_fd:
                return None
            nudged = nudged or fd == nudge_fd
        if nudged:
            with contextlib.suppress(BlockingIOError):
                while os.read(nudge_fd, 64):
                    pass
            return [Notification(n.channel, n.payload) for n in conn.notifies(timeout=0)]
        if ready:
            # The server said something (a notification, a message of another kind,
            # or the end of the connection: the next read raises): it is alive.
            check_at = time.monotonic() + check_every


__all__ = [
    "RECONNECT_CAP",
    "Listener",
    "ListenerStatistics",
    "Listening",
    "Notification",
    "delivering",
    "reconnect_backoff",
]
