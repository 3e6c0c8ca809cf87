"""Real daemon processes for fault and cluster tests.

- :class:`PgCluster`: an embedded PostgreSQL of the test's own (not the session's
  shared one), which a test may stop and start again (a database outage).
- :func:`write_config`: a TOML configuration file for a daemon process, built from
  the tests' base configuration (``tests.harness.BASE``) with sections merged in.
- :class:`~testkit.daemon.DaemonProcess` (the kit's, shared with the benchmarks):
  ``bothy-notify run`` as a child process, serving once its ``--ready-file``
  says so; its output goes to a log file the test can read (and search for
  things that must never be logged).
- :func:`read_fake_records`: the fake provider's ``push.fake.record_file``, which
  survives a killed process (a torn last line is ignored).

Every wait is bounded; nothing sleeps for a delay it could wait on instead.
"""

from __future__ import annotations

import json
import uuid
import warnings
from pathlib import Path
from typing import Any

import psycopg
import tomlkit
from psycopg.conninfo import make_conninfo

from testkit.daemon import DaemonProcess
from tests.harness import BASE, _merge


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
