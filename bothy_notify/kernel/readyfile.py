"""The ready file of ``bothy-notify run --ready-file PATH``: where the daemon serves,
as JSON, for the program that started it.

A supervisor, a script or a test starts ``bothy-notify run`` (its ports may be
``127.0.0.1:0``, chosen by the kernel), waits for ``PATH`` to exist, and reads
the bound addresses there instead of parsing the log::

    {"api": "127.0.0.1:40123", "gateway": "127.0.0.1:40125", "role": "all",
     "processes": 1, "pid": 4242, "version": "0.1.0"}

- ``api``: ``host:port`` of the HTTP API (``/healthz``, ``/metrics``, ``/v1/...``);
- ``gateway``: ``host:port`` of the WebSocket gateway (``ws://HOST:PORT/v1/gateway``),
  ``null`` for a role without one (``worker``);
- ``role``, ``processes``: what serves (``server.role``, ``server.processes``);
- ``pid``: the process to signal (SIGTERM drains, SIGHUP reloads): the parent of
  ``server.processes = N``;
- ``version``: the daemon's version.

The file is written once, when the process is ready in the sense of Trio's
``task_status.started``: its listeners accept and its services started (the
moment systemd is told ``READY=1``; with ``server.processes = N``, once every
node process is). It is written to a temporary file in the same directory and
renamed, so a reader never sees a partial file. A file left at ``PATH`` by an
earlier run is removed at the start, and the file is removed again when the
process exits (any way but SIGKILL), so its presence means "serving now".
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

from bothy_notify import __version__


class ReadyFile:
    """The ready file at ``path`` (``None``: not asked for; every method is a no-op).

    Raises:
        OSError: from :meth:`clear` and :meth:`write`, when the file cannot be
            removed or written (the directory is missing or not writable).
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None

    def __repr__(self) -> str:
        return f"ReadyFile({str(self.path)!r})" if self.path is not None else "ReadyFile(None)"

    def clear(self) -> None:
        """Remove a file left by an earlier run (nothing serves yet); check that the
        file can be written later (its directory exists)."""
        if self.path is None:
            return
        self.path.unlink(missing_ok=True)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(self.path.parent))

    def write(self, *, api: str | None, gateway: str | None, role: str, processes: int) -> None:
        """Say where this process serves (atomically: a temporary file, renamed)."""
        if self.path is None:
            return
        document = {
            "api": api,
            "gateway": gateway,
            "role": role,
            "processes": processes,
            "pid": os.getpid(),
            "version": __version__,
        }
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            partial.write_text(json.dumps(document) + "\n", encoding="utf-8")
            partial.replace(self.path)
        finally:
            partial.unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the file at exit; never raises (the process is ending anyway)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)


__all__ = ["ReadyFile"]
