"""An embedded PostgreSQL of its own that a test can stop and start again.

Not the session's shared server: stopping that one would break every other
test. The server keeps its data directory and socket across a stop, so the
daemon's URL stays valid and it can reconnect on its own.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import psycopg

from bothy_notify.store.migrate import migrate


class StoppablePostgres:
    """``start()`` once, then ``stop()`` / ``restart()`` as often as needed; ``close()``."""

    def __init__(self) -> None:
        # Short, private path: the Unix socket lives in the data directory.
        self.home = Path(tempfile.mkdtemp(prefix="bothy-stop-"))
        self._server: Any = None
        self.url = ""

    def start(self) -> str:
        """Create and start the server, migrate it; return its URL. Blocking."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            self._server = pgserver.get_server(  # type: ignore[attr-defined]
                self.home / "data", cleanup_mode="stop"
            )
        self.url = str(self._server.get_uri())
        with psycopg.connect(self.url) as conn:
            migrate(conn)
        return self.url

    def stop(self) -> None:
        """Stop the server now (``fast``: open connections are cut). Blocking."""
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(
            ["-w", "-m", "fast", "stop"],
            pgdata=self.home / "data",
            user=self._server.system_user,
        )

    def restart(self) -> None:
        """Start the stopped server again on the same data directory and socket."""
        self._server.ensure_postgres_running()
        assert str(self._server.get_uri()) == self.url

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.cleanup()
        shutil.rmtree(self.home, ignore_errors=True)
