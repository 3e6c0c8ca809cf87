"""Shared benchmark helpers: an embedded PostgreSQL in a temporary directory, a
migrated database, CPU meters (this process, a child, PostgreSQL's processes), a
profiler, and machine facts for the report (``bothy-notify run`` as a child
process: :mod:`bench._daemon`)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bothy_notify.store.embedded import EmbeddedPostgres
from bothy_notify.store.migrate import migrate


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """A fresh, migrated database: ``$BOTHY_BENCH_DATABASE_URL``'s server or an embedded one."""
    base = os.environ.get("BOTHY_BENCH_DATABASE_URL")
    embedded: EmbeddedPostgres | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if not base:
        tmp = tempfile.TemporaryDirectory(prefix="bothy-bench-")
        embedded = EmbeddedPostgres(Path(tmp.name) / "pg")
        base = embedded.start()
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(base, dbname=name)
    with psycopg.connect(url) as conn:
        migrate(conn)
    try:
        yield url
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if embedded is not None:
            embedded.stop()
        if tmp is not None:
            tmp.cleanup()


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def report(name: str, **figures: Any) -> None:
    """Print the closing JSON line every benchmark ends with."""
    print(json.dumps({"bench": name, **figures}))


def process_cpu(pid: int | None = None, *, children: bool = False) -> float:
    """CPU seconds (user + system) used so far by ``pid`` (this process by default);
    with ``children``, also by its children that have ended (and been waited for)."""
    if pid is None and not children:
        return time.process_time()
    with open(f"/proc/{pid or 'self'}/stat", encoding="ascii") as stat:
        parts = stat.read().rsplit(")", 1)[1].split()
    # Fields 14-17 of proc(5): utime, stime, cutime, cstime (here from the 3rd field on).
    ticks = int(parts[11]) + int(parts[12])
    if children:
        ticks += int(parts[13]) + int(parts[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_pid(url: str) -> int | None:
    """The postmaster's process id of the server at ``url`` when it runs on this machine."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        assert row is not None
        with open(Path(row[0]) / "postmaster.pid", encoding="ascii") as pidfile:
            pid = int(pidfile.readline())
        os.kill(pid, 0)
    except (psycopg.Error, OSError, ValueError):
        return None
    return pid


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds used so far by PostgreSQL: the postmaster, every live child
    (backends, writers, WAL), and the children that have ended (the postmaster's
    cutime/cstime), so a delta of two readings is the server's CPU in between."""
    return tree_cpu(postmaster)


def tree_cpu(parent: int) -> float:
    """CPU seconds used so far by ``parent``, its live children (and theirs that
    ended) and its children that ended: a delta of two readings is the CPU of the
    process and its direct children in between (the postmaster and its backends,
    ``bothy-notify run --processes N`` and its node processes)."""
    total = process_cpu(parent, children=True)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                parts = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(parts[1]) == parent:
            total += (sum(int(p) for p in parts[11:15])) / os.sysconf("SC_CLK_TCK")
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, to tell how loaded it was."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


class Meter:
    """CPU per request used by this process, the fake, and PostgreSQL (when given its
    postmaster), and how busy the machine was."""

    def __init__(self, fake_pid: int, postmaster: int | None = None) -> None:
        self._fake_pid = fake_pid
        self._postmaster = postmaster
        self._own = process_cpu()
        self._fake = process_cpu(fake_pid)
        self._pg = postgres_cpu(postmaster) if postmaster else 0.0
        self._busy, self._total = machine_busy()

    def stop(self, requests: int) -> dict[str, float]:
        busy, total = machine_busy()
        out = {
            "own_cpu_us": (process_cpu() - self._own) / requests * 1e6,
            "fake_cpu_us": (process_cpu(self._fake_pid) - self._fake) / requests * 1e6,
            "machine_busy_pct": 100 * (busy - self._busy) / max(1.0, total - self._total),
        }
        if self._postmaster:
            out["postgres_cpu_us"] = (postgres_cpu(self._postmaster) - self._pg) / requests * 1e6
        return out


class Profiler:
    """``py-spy record`` on this process (or ``pid``) from construction to :meth:`stop`:
    collapsed stacks (``--format raw``) in ``path``, and the top entries printed.
    ``gil``: only the samples of the thread holding the GIL (where a process's Python
    spends its CPU; waits in C are left out)."""

    def __init__(
        self, path: str, rate: int = 250, pid: int | None = None, *, gil: bool = False
    ) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.path = path
        self.proc = subprocess.Popen(
            [
                *(spy, "record", "--pid", str(pid or os.getpid()), "--threads"),
                *("--format", "raw", *(["--gil"] if gil else [])),
                *("--rate", str(rate), "--output", path, "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches

    def stop(self, top: int = 25) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        print_profile(self.path, top)


def print_profile(path: str, top: int = 25) -> None:
    """The functions with the most samples in a collapsed-stack file: own and total."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
            for f in stack.split(";")
        ]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    print(f"profile: {samples} samples in {path}")
    print("  own %  function (file)")
    for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / max(1, samples):5.1f}  {name}")
    print("  total %  function (file)")
    for name, n in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / max(1, samples):5.1f}  {name}")


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (children inherit it); return it."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
