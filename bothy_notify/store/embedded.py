"""The embedded PostgreSQL server (``pgserver``), used when ``database.url`` is empty.

Data lives in ``database.data_dir`` and survives restarts; :meth:`stop` stops
the server cleanly. pgserver runs PostgreSQL from a wheel over a Unix socket in
the data directory, also when the daemon runs as root (it switches to a
``pgserver`` system user).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger("bothy.store.embedded")


class EmbeddedPostgres:
    """A handle on the embedded server for one data directory."""

    def __init__(self, data_dir: str | Path) -> None:
        """``data_dir`` must be absolute (``database.data_dir`` is made so at load):
        the working directory is never where data goes."""
        if not Path(data_dir).is_absolute():
            raise ValueError("the embedded server's data directory must be an absolute path")
        self.data_dir = Path(data_dir).resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or attach to) the server; return its connection URL. Blocking."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting the embedded PostgreSQL server")
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            import pgserver

            self._server = pgserver.get_server(  # type: ignore[attr-defined]
                self.data_dir, cleanup_mode="stop"
            )
        return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server if this process was the last one using it (several nodes
        may share one data directory, each attached to the same server). Blocking."""
        if self._server is not None:
            server, self._server = self._server, None
            server.cleanup()
            if (self.data_dir / "postmaster.pid").exists():
                log.info("embedded PostgreSQL server left running for the other processes using it")
            else:
                log.info("embedded PostgreSQL server stopped")

    def __repr__(self) -> str:
        return "EmbeddedPostgres()"
