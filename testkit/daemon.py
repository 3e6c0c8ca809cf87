"""``bothy-notify run`` as a child process, for tests and benchmarks alike.

:class:`DaemonProcess` starts the command with ``--ready-file`` and knows the
daemon serves once that file appears (:mod:`bothy_notify.kernel.readyfile`:
the bound addresses as JSON, written when the process is ready); it never
reads the log for that. Its standard output and error go to a log file
(appended across restarts) that the caller may read, search or print.

Every wait has an absolute deadline: the start (the file appears, or the
process exits first: :class:`DaemonFailed` with the log's tail), the stop
(SIGTERM, then SIGKILL once the deadline passed: :class:`DaemonStuck`). The
waits come in two forms, the same steps each: ``async`` for Trio code (tests)
and ``*_sync`` for plain code (benchmarks, the install check).

Usage::

    daemon = DaemonProcess(config_file=path, log_file=tmp / "daemon.log")
    await daemon.start()          # or daemon.start_sync()
    ... http://{daemon.api} ... ws://{daemon.gateway}/v1/gateway
    assert await daemon.stop() == 0   # or daemon.stop_sync()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import tomlkit
import trio

POLL = 0.02
"""Seconds between two looks at the ready file and the process (a file has no
wake-up to wait on, and a start takes hundreds of these)."""
START_TIMEOUT = 120.0
"""Default bound of a start: the embedded PostgreSQL's first start and the
migrations included, on a loaded machine."""
STOP_TIMEOUT = 30.0
"""Default bound of a graceful stop: ``server.drain_period`` and the embedded
server's stop."""
KILL_TIMEOUT = 10.0
"""Seconds a SIGKILLed process may take to be gone."""
LOG_TAIL = 4000
"""Characters of the log quoted when the daemon fails to start."""


class DaemonFailed(Exception):
    """The daemon exited before it served, or did not serve in time."""


class DaemonStuck(Exception):
    """The daemon outlived its stop's deadline and was killed."""


def write_settings(path: Path, settings: Mapping[str, Any] | str) -> Path:
    """Write a configuration file: a TOML text as it is, or nested mappings as TOML."""
    text = settings if isinstance(settings, str) else tomlkit.dumps(dict(settings))
    path.write_text(text, encoding="utf-8")
    return path


def cluster_node_settings(
    records: Path, *, database: Mapping[str, Any] | None = None, fake_keep: int | None = None
) -> str:
    """The settings of one ``bothy-notify run`` node of a benchmark's cluster: role
    ``all`` in ``multi`` mode on ports 0, the database URL from ``BOTHY_BENCH_DATABASE``
    and the signing key from ``BOTHY_BENCH_KEY`` (so no secret is written), no
    coalescing, and the ``fake`` provider recording every push to ``records``.
    ``database`` adds keys to ``[database]`` (e.g. ``pool_size``); ``fake_keep`` sets
    ``push.fake.keep`` (the provider's default when ``None``)."""
    lines = [
        "[server]",
        'role = "all"',
        'api_listen = "127.0.0.1:0"',
        'gateway_listen = "127.0.0.1:0"',
        'drain_period = "5s"',
        "[cluster]",
        'mode = "multi"',
        "[database]",
        'url = "env:BOTHY_BENCH_DATABASE"',
        *(f"{key} = {tomlkit.item(value).as_string()}" for key, value in (database or {}).items()),
        "[[auth.keys]]",
        'algorithm = "HS256"',
        'key = "env:BOTHY_BENCH_KEY"',
        "[sync]",
        'heartbeat = "10s"',
        "[notify]",
        'coalesce_window = "0s"',
        "[push.fake]",
        f"record_file = {tomlkit.item(str(records)).as_string()}",
        *([f"keep = {fake_keep}"] if fake_keep is not None else []),
        "[log]",
        'level = "warning"',
    ]
    return "\n".join(lines) + "\n"


def cli_command() -> tuple[str, ...]:
    """This interpreter running the CLI (``python -m bothy_notify.cli``): the
    package this interpreter imports runs, whatever is first on ``PATH``."""
    return (sys.executable, "-m", "bothy_notify.cli")


@dataclass
class DaemonProcess:
    """One ``bothy-notify run`` child process, which may be started again.

    Attributes:
        config_file: its configuration (``--config``; relative to ``cwd``).
        log_file: where its standard output and error go (appended across starts).
        env: variables added to its environment (``env:NAME`` secrets of the file).
        args: more arguments of ``run`` (``("--processes", "2")``).
        command: the CLI (default :func:`cli_command`; the install check gives the
            installed ``bothy-notify``).
        cwd: its working directory (default: this process's).
        environ: its whole environment before ``env`` (default: this process's).
        ready_file: ``--ready-file`` (default: beside the log, ``NAME.ready.json``).
        api: ``host:port`` of its HTTP API once it serves.
        gateway: ``host:port`` of its gateway once it serves (``None`` without one).
        ready: the ready file's whole document once it serves.
        starts: how many times it was started.
    """

    config_file: Path
    log_file: Path
    env: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    command: Sequence[str] = field(default_factory=cli_command)
    cwd: Path | None = None
    environ: Mapping[str, str] | None = None
    ready_file: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    api: str = ""
    gateway: str | None = None
    ready: dict[str, Any] = field(default_factory=dict)
    starts: int = 0
    _log_offset: int = 0

    def __post_init__(self) -> None:
        if self.ready_file is None:
            self.ready_file = self.log_file.with_suffix(".ready.json")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def api_url(self) -> str:
        return f"http://{self.api}"

    @property
    def name(self) -> str:
        """The configuration file's name without its suffix (``a`` for ``a.toml``)."""
        return self.config_file.stem

    # -- start ----------------------------------------------------------------------

    def launch(self) -> None:
        """Start the process; return at once (:meth:`start` and :meth:`start_sync`
        also wait until it serves)."""
        assert self.ready_file is not None
        self.ready_file.unlink(missing_ok=True)  # a killed run's file says nothing now
        self.api, self.gateway, self.ready = "", None, {}
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *self.command,
                    "run",
                    "--config",
                    str(self.config_file),
                    "--ready-file",
                    str(self.ready_file),
                    *self.args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**(os.environ if self.environ is None else self.environ), **self.env},
                cwd=self.cwd,
            )
        self.starts += 1

    def serving(self) -> bool:
        """Whether the ready file is there (its addresses are then taken in).

        Raises:
            DaemonFailed: the process exited before it served.
        """
        assert self.process is not None and self.ready_file is not None
        try:
            text = self.ready_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.process.poll() is not None:
                raise DaemonFailed(
                    f"the daemon exited with {self.process.returncode} before serving:\n"
                    + self.log_tail()
                ) from None
            return False
        self.ready = json.loads(text)  # renamed into place whole: never partial
        self.api, self.gateway = self.ready["api"], self.ready["gateway"]
        return True

    async def start(self, *, timeout: float = START_TIMEOUT) -> Self:
        """Start the process and wait until it serves (at most ``timeout`` seconds).

        Raises:
            DaemonFailed: it exited first, or did not serve in time (then it is killed).
        """
        self.launch()
        return await self.wait_serving(timeout=timeout)

    async def wait_serving(self, *, timeout: float = START_TIMEOUT) -> Self:
        """Wait until the launched process serves (see :meth:`start`)."""
        with trio.move_on_after(timeout):
            while not self.serving():
                await trio.sleep(POLL)
            return self
        await self._killed()
        raise DaemonFailed(f"the daemon did not serve within {timeout:g} s:\n{self.log_tail()}")

    def start_sync(self, *, timeout: float = START_TIMEOUT) -> Self:
        """:meth:`start` for plain (non-Trio) code."""
        self.launch()
        return self.wait_serving_sync(timeout=timeout)

    def wait_serving_sync(self, *, timeout: float = START_TIMEOUT) -> Self:
        """:meth:`wait_serving` for plain (non-Trio) code."""
        deadline = time.monotonic() + timeout
        while not self.serving():
            if time.monotonic() > deadline:
                self.kill()
                self._reap_sync()
                raise DaemonFailed(
                    f"the daemon did not serve within {timeout:g} s:\n{self.log_tail()}"
                )
            time.sleep(POLL)
        return self

    # -- stop -----------------------------------------------------------------------

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) without waiting."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait until the process has exited; its exit status.

        Raises:
            trio.TooSlowError: it still runs after ``timeout`` seconds.
        """
        assert self.process is not None
        with trio.fail_after(timeout):
            while (code := self.process.poll()) is None:
                await trio.sleep(POLL)
        return code

    async def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (a graceful shutdown) and wait; its exit status.

        Raises:
            DaemonStuck: it outlived ``timeout``; it was killed.
        """
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process is not None else 0
        self.kill(signal.SIGTERM)
        try:
            return await self.wait_exit(timeout)
        except trio.TooSlowError:
            await self._killed()
            raise DaemonStuck(f"the daemon did not stop within {timeout:g} s") from None

    def stop_sync(self, timeout: float = STOP_TIMEOUT) -> int:
        """:meth:`stop` for plain (non-Trio) code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process is not None else 0
        self.kill(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self._reap_sync()
            raise DaemonStuck(f"the daemon did not stop within {timeout:g} s") from None

    async def crash(self) -> None:
        """SIGKILL and wait until the process is gone."""
        await self._killed()

    async def _killed(self) -> None:
        self.kill()
        with trio.CancelScope(shield=True):
            await self.wait_exit(KILL_TIMEOUT)

    def _reap_sync(self) -> None:
        assert self.process is not None
        self.process.wait(KILL_TIMEOUT)

    def __enter__(self) -> Self:
        return self.start_sync()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(DaemonStuck):  # killed: the error in flight matters more
            self.stop_sync()

    # -- what it said -----------------------------------------------------------------

    def log_text(self) -> str:
        """Everything the process wrote so far (all starts)."""
        return self.log_file.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, chars: int = LOG_TAIL) -> str:
        """The end of what the latest start wrote."""
        with self.log_file.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode("utf-8", "replace")[-chars:]

    def pin_ports(self) -> None:
        """Make the next start listen where this run listened (a restart in place)."""
        data = tomlkit.parse(self.config_file.read_text(encoding="utf-8")).unwrap()
        server = data.setdefault("server", {})
        server["api_listen"] = self.api
        if self.gateway is not None:
            server["gateway_listen"] = self.gateway
        self.config_file.write_text(tomlkit.dumps(data), encoding="utf-8")

    def metrics(self, timeout: float = 30.0) -> dict[str, float]:
        """``GET /metrics`` (blocking): every sample by ``name`` or ``name{labels}``."""
        import httpx

        text = httpx.get(f"{self.api_url}/metrics", timeout=timeout).text
        return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus' text format as ``{"name{labels}": value}`` (comments left out)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


__all__ = [
    "DaemonFailed",
    "DaemonProcess",
    "DaemonStuck",
    "cli_command",
    "parse_metrics",
    "write_settings",
]
