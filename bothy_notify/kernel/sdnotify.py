"""systemd's readiness protocol (``sd_notify``), spoken over a datagram socket.

Under a unit with ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: a Unix
datagram socket, a path (``/run/systemd/notify``) or an abstract address
(``@/org/freedesktop/systemd1/notify``, the ``@`` standing for a leading NUL).
The service sends newline-separated ``KEY=VALUE`` assignments to it, one
datagram per message:

==================================  =========================================================
sent                                when
==================================  =========================================================
``READY=1``                         the node serves: its listeners accept and its services
                                    started (the parent of ``server.processes``: every
                                    node process said so)
``STOPPING=1``                      the drain begins (the first SIGTERM/SIGINT)
``RELOADING=1`` + ``MONOTONIC_USEC`` a SIGHUP reload begins; ``READY=1`` again once it is done
``WATCHDOG=1``                      every half ``$WATCHDOG_USEC`` (``WatchdogSec=`` of the unit)
                                    while the event loop runs
``STATUS=...``                      a one-line status beside those (never a value of the
                                    configuration beyond the role and the process count)
==================================  =========================================================

This is the protocol libsystemd's ``sd_notify(3)`` implements, written here with
the standard library (no new dependency). Sending never raises and never
blocks, and the daemon goes on whatever the socket does (systemd is a
convenience, not a dependency of serving). A send that fails is not the end of
the conversation: the socket may be back for the next message (it is created
anew at ``systemctl daemon-reexec``), and a watchdog that stopped pinging
would have systemd kill a healthy daemon ``WatchdogSec`` later. So every
message is tried, on a new socket after a failure; only the warning is
throttled (the first failure, then at most one every :data:`LOG_EVERY` seconds
with the count since, and one line once a send works again). A full queue
(``EAGAIN``) loses that message only. An address that can never work (neither
a path nor an abstract name) is reported once and not tried.

:meth:`Notifier.from_environment` removes ``NOTIFY_SOCKET``, ``WATCHDOG_USEC``
and ``WATCHDOG_PID`` from the environment, as ``sd_notify(unset_environment=1)``
does, so the processes the daemon starts (the embedded PostgreSQL, the node
processes of ``server.processes``) never speak for the service: only the
main process does (systemd's default ``NotifyAccess=main``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

import trio

log = logging.getLogger("bothy.systemd")

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
WATCHDOG_PID_ENV = "WATCHDOG_PID"
LOG_EVERY = 60.0
"""Seconds between two warnings about failing sends (every message is still tried)."""


class Notifier:
    """Messages to the service manager; a no-op without ``$NOTIFY_SOCKET``.

    Args:
        address: the socket's address as ``$NOTIFY_SOCKET`` gives it (``None``: none).
        watchdog_usec: the watchdog's timeout in microseconds (``None``: no watchdog).
        monotonic: seconds of a monotonic clock, for throttling the warnings.
    """

    def __init__(
        self,
        address: str | None,
        watchdog_usec: int | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address or None
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._monotonic = monotonic
        self._sock: socket.socket | None = None
        self._invalid = False
        self._failing = False
        self._unreported = 0  # failed sends since the last warning
        self._warned_at: float | None = None
        self.failed_sends = 0
        """Sends that failed so far (statistics, tests)."""

    def __repr__(self) -> str:
        return f"Notifier(enabled={self.enabled}, watchdog_usec={self.watchdog_usec})"

    @classmethod
    def from_environment(
        cls, environ: MutableMapping[str, str] | None = None, *, unset: bool = True
    ) -> Notifier:
        """The notifier ``environ`` (default: the process's environment) asks for.

        ``$WATCHDOG_USEC`` counts only when ``$WATCHDOG_PID`` is absent or names
        this process. With ``unset`` the three variables are removed from
        ``environ`` (see the module docstring).
        """
        env = os.environ if environ is None else environ
        address = env.get(NOTIFY_SOCKET_ENV)
        usec_text = env.get(WATCHDOG_USEC_ENV, "")
        pid_text = env.get(WATCHDOG_PID_ENV, "")
        if unset:
            for name in (NOTIFY_SOCKET_ENV, WATCHDOG_USEC_ENV, WATCHDOG_PID_ENV):
                env.pop(name, None)
        usec: int | None = int(usec_text) if usec_text.isdigit() else None
        if pid_text and (not pid_text.isdigit() or int(pid_text) != os.getpid()):
            usec = None
        return cls(address, usec)

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens."""
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between two ``WATCHDOG=1`` (half the timeout), or ``None``."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2_000_000

    def notify(self, *assignments: str) -> bool:
        """Send ``assignments`` (``"READY=1"``, ...) in one datagram; whether it was sent.

        A failed send is tried again with the next message, on a new socket (see the
        module docstring); it never raises.
        """
        if self.address is None or self._invalid:
            return False
        try:
            address = _sockaddr(self.address)
        except ValueError:
            self._invalid = True
            log.warning("NOTIFY_SOCKET is neither a path nor an abstract address; not notifying")
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto("\n".join(assignments).encode(), address)
        except BlockingIOError:
            return False  # the manager's queue is full: this message is lost, not the next
        except OSError as exc:
            self._send_failed(exc)
            return False
        if self._failing:
            self._failing = False
            log.info(
                "notifying the service manager again",
                extra={"failed_sends": self._unreported},
            )
            self._unreported = 0
        return True

    def _send_failed(self, exc: OSError) -> None:
        """Count a failed send, drop the socket (the next message makes a new one) and
        warn, throttled to one warning every :data:`LOG_EVERY` seconds."""
        self.close()
        self._failing = True
        self.failed_sends += 1
        self._unreported += 1
        now = self._monotonic()
        if self._warned_at is None or now - self._warned_at >= LOG_EVERY:
            self._warned_at = now
            log.warning(
                "cannot notify the service manager; trying again with the next message",
                extra={"error_type": type(exc).__name__, "failed_sends": self._unreported},
            )
            self._unreported = 0

    def ready(self, status: str = "") -> bool:
        """``READY=1``: the service serves."""
        return self.notify("READY=1", *_status(status))

    def stopping(self, status: str = "") -> bool:
        """``STOPPING=1``: the drain begins."""
        return self.notify("STOPPING=1", *_status(status))

    def reloading(self, status: str = "") -> bool:
        """``RELOADING=1`` with the monotonic time (send :meth:`ready` when done)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the event loop is alive."""
        return self.notify("WATCHDOG=1")

    async def keep_watchdog(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Send ``WATCHDOG=1`` every :attr:`watchdog_interval` until cancelled.

        Sent from a task of the event loop, so a loop that stops turning (a
        blocking call, a deadlock) stops the pings and systemd restarts the
        service; a database outage does not (the loop still turns). Returns at
        once without a watchdog.
        """
        task_status.started()
        interval = self.watchdog_interval
        if interval is None or not self.enabled:
            return
        while True:
            self.watchdog()
            await trio.sleep(interval)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _sockaddr(address: str) -> str | bytes:
    """``$NOTIFY_SOCKET`` as a socket address: ``@name`` is the abstract ``\\0name``."""
    if address.startswith("@"):
        return b"\0" + address[1:].encode()
    if address.startswith("/"):
        return address
    raise ValueError("NOTIFY_SOCKET is neither a path nor an abstract address")


def _status(text: str) -> tuple[str, ...]:
    line = " ".join(text.split())
    return (f"STATUS={line}",) if line else ()


__all__ = ["Notifier"]
