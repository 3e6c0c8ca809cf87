"""Real daemon processes for fault and cluster tests.

- :class:`PgCluster`: an embedded PostgreSQL of the test's own (not the session's
  shared one), which a test may stop and start again (a database outage).
- :func:`write_config`: a TOML configuration file for a daemon process, built from
  the tests' base configuration (``tests.harness.BASE``) with sections merged in.
- :class:`DaemonProcess`: ``bothy-notify run`` as a child process; its addresses
  are read from the line it prints once it serves, its output goes to a log file
  the test can read (and search for things that must never be logged).
- :func:`read_fake_records`: the fake provider's ``push.fake.record_file``, which
  survives a killed process (a torn last line is ignored).

Every wait is bounded; nothing sleeps for a delay it could wait on instead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import tomlkit
import trio
from psycopg.conninfo import make_conninfo

from tests.harness import BASE, _merge

_RUNNING = re.compile(
    r"bothy-notify running \(role (?P<role>\w+)(?:, (?P<processes>\d+) processes)?\):"
    r" API http://(?P<api>\S+?)"
    r"(?:, gateway ws://(?P<gateway>\S+?)/v1/gateway)?$",
    re.MULTILINE,
)


class PgCluster:
    """An embedded PostgreSQL in ``home`` that a test can stop and start.

    ``url`` stays the same across a stop and a start (pgserver listens on a Unix
    socket in a directory derived from the data directory).
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self.data_dir = home / "pgdata"
        self._server: Any = None
        self.url = ""

    def start(self) -> str:
        """Start the server (blocking); return its URL."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            if self._server is None:
                self._server = pgserver.get_server(self.data_dir, cleanup_mode="stop")  # type: ignore[attr-defined]
            else:
                with self._server._lock:
                    self._server.ensure_postgres_running()
        self.url = str(self._server.get_uri())
        return self.url

    def stop(self) -> None:
        """Stop the server now (fast shutdown: open connections break). Blocking."""
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(
            ["-w", "-m", "fast", "stop"],
            pgdata=self.data_dir,
            user=self._server.system_user,
            timeout=30,
        )

    def close(self) -> None:
        """Stop the server for good (if it runs). Blocking."""
        if self._server is not None:
            server, self._server = self._server, None
            server.cleanup()

    def new_database(self) -> str:
        """A fresh, empty database on this server; its URL (daemons migrate it)."""
        name = f"f_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return make_conninfo(self.url, dbname=name)


def write_config(
    path: Path, database_url: str, *, record_file: Path | None = None, **sections: Any
) -> Path:
    """Write a daemon configuration to ``path``: the tests' base configuration, the
    database at ``database_url``, the fake provider recording to ``record_file``,
    and ``sections`` merged in (``notify={...}``). Returns ``path``."""
    data = _merge(BASE, {"database": {"url": database_url}})
    data = _merge(data, {"log": {"level": "info", "format": "json"}})
    if record_file is not None:
        data = _merge(data, {"push": {"fake": {"record_file": str(record_file)}}})
    data = _merge(data, sections)
    path.write_text(tomlkit.dumps(data), encoding="utf-8")
    return path


@dataclass
class DaemonProcess:
    """One ``bothy-notify run`` child process.

    Attributes:
        config_file: its configuration.
        log_file: where its standard output and error go (appended across restarts).
        args: more arguments of ``run`` (``--processes 2``).
        api: ``host:port`` of its HTTP API once it serves.
        gateway: ``host:port`` of its gateway (``None`` without one).
        starts: how many times it was started.
    """

    config_file: Path
    log_file: Path
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    api: str = ""
    gateway: str | None = None
    starts: int = 0

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def api_url(self) -> str:
        return f"http://{self.api}"

    async def start(self, *, timeout: float = 60.0) -> DaemonProcess:
        """Start the process and wait until it serves (its "running" line)."""
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        log = self.log_file.open("ab")
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bothy_notify.cli",
                    "run",
                    "--config",
                    str(self.config_file),
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
            )
        finally:
            log.close()
        self.starts += 1
        with trio.fail_after(timeout):
            while True:
                text = self.log_file.read_bytes()[offset:].decode("utf-8", "replace")
                found = _RUNNING.search(text)
                if found is not None:
                    self.api = found["api"]
                    self.gateway = found["gateway"]
                    return self
                if self.process.poll() is not None:
                    raise AssertionError(
                        f"the daemon exited with {self.process.returncode} before serving:\n"
                        + text[-4000:]
                    )
                await trio.sleep(0.02)

    def pin_ports(self) -> None:
        """Make the next start listen where this run listened (a restart in place)."""
        data = tomlkit.parse(self.config_file.read_text(encoding="utf-8")).unwrap()
        server = data.setdefault("server", {})
        server["api_listen"] = self.api
        if self.gateway is not None:
            server["gateway_listen"] = self.gateway
        self.config_file.write_text(tomlkit.dumps(data), encoding="utf-8")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) without waiting."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    async def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait until the process has exited; return its exit code."""
        assert self.process is not None
        with trio.fail_after(timeout):
            while (code := self.process.poll()) is None:
                await trio.sleep(0.02)
        return code

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful shutdown) and wait; SIGKILL if it outlives ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process is not None else 0
        self.kill(signal.SIGTERM)
        try:
            return await self.wait_exit(timeout)
        except trio.TooSlowError:
            self.kill()
            await self.wait_exit(10)
            raise

    async def crash(self) -> None:
        """SIGKILL and wait until the process is gone."""
        self.kill()
        await self.wait_exit(10)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        """Everything the process wrote so far (all starts)."""
        return self.log_file.read_text(encoding="utf-8", errors="replace")


def read_fake_records(path: Path) -> list[dict[str, Any]]:
    """The fake provider's records; a torn last line (a killed writer) is ignored."""
    if not path.exists():
        return []
    records: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


__all__ = ["DaemonProcess", "PgCluster", "read_fake_records", "write_config"]
