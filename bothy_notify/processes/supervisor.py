"""Keep N child processes running: start, readiness, restarts, drain, stop.

:class:`Supervisor` knows nothing of what the children do; it speaks the
control channel (:mod:`bothy_notify.processes.control`) with each of them:

- **start**: every child is started at once with its spec; ``on_ready`` is
  called once every child has said ``ready`` (a child that dies before that is
  retried like any failure at start).
- **a child dies** while nobody asked it to stop: one warning with its ordinal
  and exit status, and it is started again (same ordinal, a new process)
  after a backoff of :data:`FIRST_DELAY` doubling to :data:`MAX_DELAY`; a
  child that stayed up :data:`MAX_DELAY` starts from the first delay again
  (:mod:`bothy_notify.kernel.backoff`, the rule ``Supervised`` follows too).
- **a child fails at start** (exits before ``ready``, or is not ready within
  ``start_timeout``) :data:`START_ATTEMPTS` times in a row, or exits with
  status 2 (a configuration error, which a retry cannot fix): the supervisor
  drains the others and :meth:`Supervisor.run` returns that status (1 for
  anything but 2).
- **drain** (:meth:`Supervisor.drain`, the parent's first SIGINT/SIGTERM):
  ``drain`` to every child; once each has exited, :meth:`Supervisor.run`
  returns 0 (1 when a child exited with another status). A child still running
  ``drain_bound`` seconds later is told ``stop``, and killed
  :data:`KILL_AFTER` seconds after that.
- **stop** (:meth:`Supervisor.stop`, a second signal): ``stop`` to every
  child, killed :data:`KILL_AFTER` seconds later if still running.
- **reload** (:meth:`Supervisor.reload`, SIGHUP): ``reload`` to every child
  running now (a child started later loads the configuration anyway).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from bothy_notify.kernel.backoff import RESTART_FIRST, RESTART_MAX, restart_backoff
from bothy_notify.processes.control import DRAIN, READY, RELOAD, STOP, SUPERVISED_ENV, ChildSpec

log = logging.getLogger("bothy.processes")

FIRST_DELAY = RESTART_FIRST
"""Seconds before a child is started again (the rule of ``Supervised`` too)."""
MAX_DELAY = RESTART_MAX
"""Longest wait before a restart; also how long a child must stay up to start from
:data:`FIRST_DELAY` again."""
START_ATTEMPTS = 3
"""Failures at start in a row after which the parent gives up (and exits non-zero)."""
START_TIMEOUT = 120.0
"""Seconds a child may take to say ``ready`` (a database that is slow to answer is
retried inside the child for 30 s per pool)."""
KILL_AFTER = 10.0
"""Seconds between ``stop`` and SIGKILL: cleanups (giving jobs back, closing pools)
are short."""

EXIT_GRACE = 5.0
"""Seconds a child whose channel ended before ``ready`` has to exit on its own (its
interpreter closes the channel before it is gone) before it is killed."""

EXIT_USAGE = 2
"""A child's exit status for bad usage or configuration (``bothy_notify.cli``)."""


def describe_exit(returncode: int | None) -> str:
    """A child's exit status in words: ``status 1``, ``signal SIGKILL``."""
    if returncode is None:
        return "running"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


@dataclass
class _Child:
    ordinal: int
    process: trio.Process
    channel: trio.socket.SocketType


class Supervisor:
    """N children, each ``command`` with its control channel (see the module docstring).

    Args:
        count: how many children.
        command: the argv of a child.
        spec: the spec of the child with an ordinal (1 to ``count``).
        env: the environment of every child (the control channel's variable is added).
        drain_bound: seconds a child may take to exit after ``drain``.
        on_ready: called once, when every child has said ``ready`` for the first time.
        on_exit: called with a child's pid once it has exited (its metric files).
        first_delay, max_delay, start_attempts, start_timeout, kill_after: the
            timings above (tests shorten them).
    """

    def __init__(
        self,
        *,
        count: int,
        command: Sequence[str],
        spec: Callable[[int], ChildSpec],
        env: Mapping[str, str],
        drain_bound: float,
        on_ready: Callable[[], None] = lambda: None,
        on_exit: Callable[[int], None] = lambda pid: None,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        start_attempts: int = START_ATTEMPTS,
        start_timeout: float = START_TIMEOUT,
        kill_after: float = KILL_AFTER,
    ) -> None:
        self.count = count
        self._command = list(command)
        self._spec = spec
        self._env = dict(env)
        self._drain_bound = drain_bound
        self._on_ready = on_ready
        self._on_exit = on_exit
        self.backoff = restart_backoff(first_delay, max_delay)
        self._start_attempts = start_attempts
        self._start_timeout = start_timeout
        self._kill_after = kill_after
        self._children: dict[int, _Child] = {}
        self._ready: set[int] = set()
        self._ready_reported = False
        self._stopping = trio.Event()
        self._stop_now = False
        self._helpers: trio.Nursery | None = None
        self.exit_code = 0
        """What :meth:`run` returns, as known so far."""
        self.restarts = 0
        """Children started again after they died (statistics, tests)."""

    def __repr__(self) -> str:
        return f"Supervisor(count={self.count}, running={len(self._children)})"

    def pids(self) -> dict[int, int]:
        """The running children's pids by ordinal."""
        return {k: c.process.pid for k, c in self._children.items()}

    async def run(self) -> int:
        """Run the children until they are drained or stopped, or one keeps failing
        at start; returns the exit status for the parent (see the module docstring).

        Cancellation kills the children that still run (SIGKILL) and waits for them.
        """
        try:
            async with trio.open_nursery() as helpers:
                self._helpers = helpers
                async with trio.open_nursery() as keepers:
                    for ordinal in range(1, self.count + 1):
                        keepers.start_soon(self._keep, ordinal)
                # Every keeper returned: each child exited and none is restarted. The
                # drain's bound and the kill timer are no longer needed.
                helpers.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for child in list(self._children.values()):
                    _kill(child)
                    await child.process.wait()
                    child.channel.close()
        return self.exit_code

    def drain(self) -> None:
        """Ask every child to shut down gracefully; nothing is restarted from now on.
        A child still running ``drain_bound`` seconds later is stopped."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._send_all(DRAIN)
        if self._helpers is not None:
            self._helpers.start_soon(self._bound_drain)

    def stop(self) -> None:
        """Ask every child to stop at once (a second signal); SIGKILL for those still
        running ``kill_after`` seconds later."""
        if self._stop_now:
            return
        self._stopping.set()
        self._stop_now = True
        self._send_all(STOP)
        if self._helpers is not None:
            self._helpers.start_soon(self._kill_later)

    def reload(self) -> None:
        """Ask every running child to reload its configuration (SIGHUP)."""
        if not self._stopping.is_set():
            self._send_all(RELOAD)

    def _send_all(self, line: bytes) -> None:
        if self._helpers is not None:
            for child in list(self._children.values()):
                self._helpers.start_soon(_send, child, line)

    async def _bound_drain(self) -> None:
        await trio.sleep(self._drain_bound)
        if self._children:
            log.warning("node processes still running after the drain period; stopping them")
            self.stop()

    async def _kill_later(self) -> None:
        await trio.sleep(self._kill_after)
        for child in list(self._children.values()):
            log.warning("node process killed", extra={"ordinal": child.ordinal})
            _kill(child)

    async def _keep(self, ordinal: int) -> None:
        failures = 0
        retries = self.backoff.retries()
        while True:
            child = await self._spawn(ordinal)
            ready = await self._wait_ready(child)
            ready_at = trio.current_time()
            if ready:
                failures = 0
                self._ready.add(ordinal)
                if len(self._ready) == self.count and not self._ready_reported:
                    self._ready_reported = True
                    self._on_ready()
            elif not self._stopping.is_set():
                # Its channel ended (it is exiting) or it was not ready in time.
                with trio.move_on_after(EXIT_GRACE):
                    await child.process.wait()
                _kill(child)
            await child.process.wait()
            code = child.process.returncode
            del self._children[ordinal]
            child.channel.close()
            self._on_exit(child.process.pid)
            if self._stopping.is_set():
                if code != 0 and not self._stop_now:
                    self.exit_code = self.exit_code or 1
                    log.warning(
                        "node process stopped with an error",
                        extra={"ordinal": ordinal, "exit_status": describe_exit(code)},
                    )
                return
            if not ready:
                failures += 1
                log.error(
                    "node process failed at start",
                    extra={
                        "ordinal": ordinal,
                        "exit_status": describe_exit(code),
                        "failures": failures,
                    },
                )
                if code == EXIT_USAGE or failures >= self._start_attempts:
                    log.error("node processes keep failing at start; stopping")
                    self.exit_code = EXIT_USAGE if code == EXIT_USAGE else 1
                    self.drain()
                    return
                delay = retries.failed()
            else:
                log.warning(
                    "node process exited unexpectedly; starting it again",
                    extra={"ordinal": ordinal, "exit_status": describe_exit(code)},
                )
                delay = retries.failed(up_for=trio.current_time() - ready_at)
            with trio.move_on_after(delay):
                await self._stopping.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1

    async def _spawn(self, ordinal: int) -> _Child:
        ours, theirs = socket.socketpair()
        try:
            process = await trio.lowlevel.open_process(
                self._command,
                stdin=subprocess.DEVNULL,
                env={**self._env, SUPERVISED_ENV: str(theirs.fileno())},
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        child = _Child(ordinal, process, trio.socket.from_stdlib_socket(ours))
        self._children[ordinal] = child
        await _send(child, self._spec(ordinal).to_line())
        if self._stopping.is_set():  # a signal came while it was being started
            await _send(child, STOP if self._stop_now else DRAIN)
        return child

    async def _wait_ready(self, child: _Child) -> bool:
        """Whether ``child`` said ``ready`` before its channel ended (it exited) and
        within ``start_timeout``."""
        buffer = b""
        with trio.move_on_after(self._start_timeout):
            while b"\n" not in buffer:
                try:
                    data = await child.channel.recv(64)
                except OSError:
                    data = b""
                if not data:
                    return False
                buffer += data
            return buffer.partition(b"\n")[0] + b"\n" == READY
        return False


async def _send(child: _Child, line: bytes) -> None:
    # A child already gone: its exit is handled where it is waited for.
    with contextlib.suppress(OSError):
        await child.channel.send(line)


def _kill(child: _Child) -> None:
    if child.process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.process.kill()


def child_command(config_path: str | None) -> list[str]:
    """The argv of a node process: this interpreter running ``bothy-notify run``."""
    argv = [sys.executable, "-m", "bothy_notify.cli", "run"]
    if config_path is not None:
        argv += ["--config", config_path]
    return argv


__all__ = ["Supervisor", "child_command", "describe_exit"]
