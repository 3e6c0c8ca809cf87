"""An opt-in memory diagnostic: ``tracemalloc`` statistics written on SIGUSR2.

With ``BOTHY_NOTIFY_MEMORY_TRACE=FILE`` in its environment, ``bothy-notify run``
starts :mod:`tracemalloc` (one frame per allocation, or as many as
``PYTHONTRACEMALLOC`` asks) and, at each SIGUSR2, takes a snapshot and writes
``FILE`` (``{pid}`` in the name is the process id, for ``server.processes``):
one JSON document with the traced memory now, and the top allocation sites by
growth since the first snapshot (the first SIGUSR2 is the baseline: its
document lists the largest sites). Only ``file:line`` and byte and block
counts are written, never a value. The file is replaced whole (a temporary file
renamed), so a reader never sees half of one. No network endpoint, nothing
without the variable; ``docs/operations.md``, "Memory diagnostics".
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

ENV = "BOTHY_NOTIFY_MEMORY_TRACE"
TOP = 25
"""Allocation sites in a report."""


def requested(environ: Mapping[str, str] | None = None) -> Path | None:
    """The report file ``BOTHY_NOTIFY_MEMORY_TRACE`` names (``{pid}`` filled in), or
    ``None`` when the diagnostic is off."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if not value:
        return None
    return Path(value.replace("{pid}", str(os.getpid()))).expanduser()


def _ignored(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    return snapshot.filter_traces(
        (
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
            tracemalloc.Filter(False, "<unknown>"),
        )
    )


def _site(stat: tracemalloc.Statistic | tracemalloc.StatisticDiff) -> str:
    frame = stat.traceback[0]
    return f"{frame.filename}:{frame.lineno}"


class MemoryTrace:
    """Snapshots on demand and the report of each against the first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._baseline: tracemalloc.Snapshot | None = None
        self._baseline_at = 0.0
        self.reports = 0

    @staticmethod
    def start() -> None:
        """Start tracing, unless ``PYTHONTRACEMALLOC`` already did."""
        if not tracemalloc.is_tracing():
            tracemalloc.start(1)

    def report(self) -> dict[str, Any]:
        """Take a snapshot and write the report; returns it."""
        snapshot = _ignored(tracemalloc.take_snapshot())
        current, peak = tracemalloc.get_traced_memory()
        now = time.time()
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "at": now,
            "traced_bytes": current,
            "traced_peak_bytes": peak,
        }
        if self._baseline is None:
            self._baseline, self._baseline_at = snapshot, now
            out["baseline_at"] = now
            out["largest"] = [
                {"site": _site(s), "size": s.size, "count": s.count}
                for s in snapshot.statistics("lineno")[:TOP]
            ]
        else:
            diffs = snapshot.compare_to(self._baseline, "lineno")
            diffs.sort(key=lambda d: d.size_diff, reverse=True)
            out["baseline_at"] = self._baseline_at
            out["growers"] = [
                {
                    "site": _site(d),
                    "size_diff": d.size_diff,
                    "size": d.size,
                    "count_diff": d.count_diff,
                }
                for d in diffs[:TOP]
                if d.size_diff > 0
            ]
        partial = self.path.with_name(self.path.name + ".tmp")
        partial.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        partial.replace(self.path)
        self.reports += 1
        return out

    async def serve(self) -> None:
        """Write a report at every SIGUSR2 until cancelled (the snapshot in a thread:
        the event loop keeps its turns while it is taken and compared)."""
        with trio.open_signal_receiver(signal.SIGUSR2) as signals:
            async for _ in signals:
                try:
                    await trio.to_thread.run_sync(self.report)
                except OSError as exc:  # the diagnostic never stops the daemon
                    print(
                        f"memory trace: cannot write the report: {exc}",
                        file=sys.stderr,
                        flush=True,
                    )
