"""The opt-in memory diagnostic (``BOTHY_NOTIFY_MEMORY_TRACE``): tracemalloc reports on SIGUSR2."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bothy_notify.kernel import memtrace

KEPT: list[bytes] = []


@pytest.fixture
def tracing() -> Iterator[None]:
    was = tracemalloc.is_tracing()
    memtrace.MemoryTrace.start()
    try:
        yield
    finally:
        KEPT.clear()
        if not was:
            tracemalloc.stop()


def grow() -> None:
    KEPT.extend(bytes(4096) for _ in range(256))  # about 1 MB, on one line


def test_the_variable_names_the_file_with_the_pid_filled_in() -> None:
    found = memtrace.requested({memtrace.ENV: "/tmp/trace-{pid}.json"})
    assert found == Path(f"/tmp/trace-{os.getpid()}.json")


def test_without_the_variable_the_diagnostic_is_off() -> None:
    assert memtrace.requested({}) is None


def test_a_later_report_names_the_line_that_grew_since_the_first(
    tmp_path: Path, tracing: None
) -> None:
    trace = memtrace.MemoryTrace(tmp_path / "trace.json")
    trace.report()
    grow()
    trace.report()
    written = json.loads((tmp_path / "trace.json").read_text())
    top = written["growers"][0]
    line = grow.__code__.co_firstlineno + 1
    assert (top["site"], top["size_diff"] > 1_000_000) == (f"{__file__}:{line}", True)


def test_a_report_holds_only_sites_and_counts(tmp_path: Path, tracing: None) -> None:
    trace = memtrace.MemoryTrace(tmp_path / "trace.json")
    trace.report()
    grow()
    written = trace.report()
    assert {
        "keys": sorted(written),
        "grower_keys": {tuple(sorted(g)) for g in written["growers"]},
    } == {
        "keys": ["at", "baseline_at", "growers", "pid", "traced_bytes", "traced_peak_bytes"],
        "grower_keys": {("count_diff", "site", "size", "size_diff")},
    }


async def test_sigusr2_writes_a_report(tmp_path: Path, tracing: None) -> None:
    path = tmp_path / "trace.json"
    trace = memtrace.MemoryTrace(path)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trace.serve)
            await trio.testing.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGUSR2)
            while trace.reports == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert json.loads(path.read_text())["pid"] == os.getpid()
