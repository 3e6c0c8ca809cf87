"""The daemon as a user starts it, for the benchmarks: ``bothy-notify run --config
<toml>`` in a child process, through the kit's launcher
(:class:`testkit.daemon.DaemonProcess`: ready once its ``--ready-file`` says so).

:func:`bench_daemon` writes the configuration into a working directory (the
embedded PostgreSQL in ``WORKDIR/pg`` unless the settings give
``database.url``) and runs the CLI there; :class:`BenchDaemon` adds the
benchmarks' meters: CPU read from ``/proc`` for the daemon alone
(:meth:`~BenchDaemon.cpu_seconds`, its node processes with
:meth:`~BenchDaemon.tree_cpu_seconds`) and for PostgreSQL's processes
(:meth:`~BenchDaemon.postgres_cpu`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import postgres_cpu, process_cpu, tree_cpu
from testkit.daemon import DaemonProcess, write_settings

KEY = "bench-only-hs256-key-0123456789abcdef"
"""The HS256 key of the benchmarks' daemons (``env:BOTHY_BENCH_KEY``)."""


def add_code_argument(parser: argparse.ArgumentParser) -> None:
    """``--code DIR``: the daemon runs that source tree's code (see :func:`daemon_env`)."""
    parser.add_argument(
        "--code",
        type=Path,
        default=None,
        help="run the daemon from this source tree (another commit, for a before/after)",
    )


def daemon_env(args: Any) -> dict[str, str]:
    """The daemon's environment: the key, and with ``args.code`` (a source tree)
    ``PYTHONPATH`` so that the daemon runs that tree's code (a before/after in one run)."""
    env = {"BOTHY_BENCH_KEY": KEY}
    if getattr(args, "code", None):
        env["PYTHONPATH"] = str(Path(args.code).resolve())
    return env


@dataclass
class BenchDaemon(DaemonProcess):
    """The kit's launcher with CPU meters (Linux ``/proc``)."""

    def cpu_seconds(self) -> float:
        """User + system CPU of the daemon process so far (its threads included)."""
        return process_cpu(self.pid)

    def tree_cpu_seconds(self) -> float:
        """CPU of the command and its node processes (``server.processes``) so far."""
        return tree_cpu(self.pid)

    def postmaster(self) -> int | None:
        """The embedded PostgreSQL's postmaster pid, if it runs in ``WORKDIR/pg``."""
        assert self.cwd is not None
        pidfile = self.cwd / "pg" / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def postgres_cpu(self) -> float:
        """CPU seconds of PostgreSQL's processes so far (0 when not embedded here)."""
        postmaster = self.postmaster()
        return postgres_cpu(postmaster) if postmaster else 0.0


def bench_daemon(
    workdir: Path,
    settings: Mapping[str, Any] | str,
    env: Mapping[str, str],
    *,
    name: str = "daemon",
    args: Sequence[str] = (),
) -> BenchDaemon:
    """A daemon of ``settings`` (nested mappings or TOML text) run in ``workdir``:
    ``NAME.toml``, ``NAME.log``; with mappings, ``database.data_dir`` is
    ``WORKDIR/pg`` unless ``database.url`` is given. Not started yet."""
    if not isinstance(settings, str):
        data = {
            key: dict(value) if isinstance(value, Mapping) else value
            for key, value in settings.items()
        }
        database = data.setdefault("database", {})
        if "url" not in database:
            database.setdefault("data_dir", str(workdir / "pg"))
        settings = data
    return BenchDaemon(
        config_file=write_settings(workdir / f"{name}.toml", settings),
        log_file=workdir / f"{name}.log",
        env=env,
        args=tuple(args),
        cwd=workdir,  # not the repository: PYTHONPATH decides whose code runs
    )
