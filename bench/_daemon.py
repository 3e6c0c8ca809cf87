"""The daemon as a user starts it: ``bothy-notify run --config <toml>`` in a child process.

:class:`CliDaemon` writes the configuration into a temporary directory, starts
the CLI there (the embedded PostgreSQL in that directory unless the settings
give ``database.url``), waits for the line ``bothy-notify running ...`` and
reads the bound addresses from it. CPU is read from ``/proc`` per process: the
daemon alone (:meth:`CliDaemon.cpu_seconds`) and PostgreSQL's processes
(:meth:`CliDaemon.postgres_cpu`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import tomlkit

from bench._common import postgres_cpu, process_cpu

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


_RUNNING = re.compile(
    r"bothy-notify running \(role \w+\): API http://(?P<api>\S+?)"
    r"(?:, gateway ws://(?P<gateway>\S+?)/v1/gateway)?(?:,|$)",
    re.MULTILINE,
)


class CliDaemon:
    """One ``bothy-notify run`` child process.

    Args:
        workdir: where the configuration, the log and (embedded) the database go.
        settings: the TOML document as nested dicts; ``database.data_dir`` defaults
            to ``workdir/pg`` unless ``database.url`` is given.
        env: extra environment (``env:NAME`` secrets of the settings).
    """

    def __init__(self, workdir: Path, settings: dict[str, Any], env: dict[str, str]) -> None:
        self.workdir = workdir
        self.log = workdir / "daemon.log"
        self.config = workdir / "bothy-notify.toml"
        database = settings.setdefault("database", {})
        if "url" not in database:
            database.setdefault("data_dir", str(workdir / "pg"))
        self.config.write_text(tomlkit.dumps(settings))
        self.env = {**os.environ, **env}
        self.process: subprocess.Popen[bytes] | None = None
        self.api = ""
        self.gateway = ""

    def __enter__(self) -> CliDaemon:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 180.0) -> None:
        """Start the CLI and wait until it serves."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bothy_notify.cli", "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,  # not the repository: PYTHONPATH decides whose code runs
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = _RUNNING.search(self.log.read_text(errors="replace"))
            if found is not None:
                self.api, self.gateway = found["api"], found["gateway"] or ""
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"the daemon exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the daemon did not start in time")

    def cpu_seconds(self) -> float:
        """User + system CPU of the daemon process so far (its threads included)."""
        return process_cpu(self.pid)

    def postmaster(self) -> int | None:
        """The embedded PostgreSQL's postmaster pid, if it runs in ``workdir/pg``."""
        pidfile = self.workdir / "pg" / "postmaster.pid"
        try:
            return int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def postgres_cpu(self) -> float:
        """CPU seconds of PostgreSQL's processes so far (0 when not embedded here)."""
        postmaster = self.postmaster()
        return postgres_cpu(postmaster) if postmaster else 0.0

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples by ``name{labels}``."""
        text = httpx.get(f"http://{self.api}/metrics", timeout=60).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; the embedded server stops with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
