"""The parent's supervision of its node processes, with real child processes that
speak the control channel (``tests/processes/fake_node.py``): start and readiness,
restart after a death, giving up on children that keep failing at start, drain,
stop and kill.

Timings are shortened through the supervisor's own parameters; every wait polls a
condition under the test's absolute deadline.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from bothy_notify.config import Role
from bothy_notify.processes.control import ChildSpec
from bothy_notify.processes.supervisor import Supervisor

FAKE_NODE = Path(__file__).with_name("fake_node.py")


def spec(ordinal: int) -> ChildSpec:
    return ChildSpec(ordinal, 2, Role.ALL, "127.0.0.1:1", "127.0.0.1:2", "postgresql:///x")


def supervisor(
    behaviour: str, records: Path, *, count: int = 2, **timings: float
) -> tuple[Supervisor, list[str]]:
    ready: list[str] = []
    return (
        Supervisor(
            count=count,
            command=[sys.executable, str(FAKE_NODE), behaviour, str(records)],
            spec=spec,
            env=dict(os.environ),
            drain_bound=timings.pop("drain_bound", 30.0),
            on_ready=lambda: ready.append("ready"),
            first_delay=timings.pop("first_delay", 0.01),
            max_delay=timings.pop("max_delay", 0.05),
            **timings,  # type: ignore[arg-type]
        ),
        ready,
    )


def events(records: Path) -> Counter[str]:
    if not records.exists():
        return Counter()
    return Counter(records.read_text(encoding="ascii").splitlines())


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await trio.sleep(0.01)


async def test_every_child_gets_its_ordinal_and_ready_is_reported_once_all_serve(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("serve", records, count=3)
    async with trio.open_nursery() as nursery:
        codes: list[int] = []

        async def run() -> None:
            codes.append(await sup.run())

        nursery.start_soon(run)
        await until(lambda: ready == ["ready"])
        assert sorted(sup.pids()) == [1, 2, 3]
        assert len(set(sup.pids().values())) == 3
        sup.drain()
    assert codes == [0]
    assert ready == ["ready"]
    seen = events(records)
    for ordinal in (1, 2, 3):
        assert seen[f"{ordinal} spec"] == 1
        assert seen[f"{ordinal} drain"] == 1
        assert seen[f"{ordinal} exit"] == 1
    assert sup.restarts == 0


async def test_a_child_that_dies_is_started_again_with_its_ordinal_and_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("serve", records)
    caplog.set_level(logging.WARNING, logger="bothy.processes")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.run)
        await until(lambda: ready == ["ready"])
        victim = sup.pids()[2]
        os.kill(victim, signal.SIGKILL)
        await until(lambda: sup.pids().get(2, victim) != victim)
        await until(lambda: events(records)["2 spec"] == 2)
        sup.drain()
    assert sup.restarts == 1
    assert events(records)["1 spec"] == 1
    reports = [
        (r.getMessage(), r.__dict__["ordinal"], r.__dict__["exit_status"])
        for r in caplog.records
        if r.name == "bothy.processes"
    ]
    assert reports == [("node process exited unexpectedly; starting it again", 2, "signal SIGKILL")]
    assert str(victim) not in caplog.text


async def test_children_that_keep_failing_at_start_end_the_run_with_status_1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("fail:1", records, start_attempts=3)
    caplog.set_level(logging.WARNING, logger="bothy.processes")
    with trio.fail_after(20):
        assert await sup.run() == 1
    assert ready == []
    failed = [r for r in caplog.records if r.getMessage() == "node process failed at start"]
    # The first child to fail three times ends the run; the other is not restarted.
    assert max(r.__dict__["failures"] for r in failed) == 3
    assert {r.__dict__["exit_status"] for r in failed} == {"status 1"}
    assert sup.pids() == {}


async def test_a_configuration_error_at_start_ends_the_run_at_once_with_status_2(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("fail:2", records, start_attempts=5)
    with trio.fail_after(20):
        assert await sup.run() == 2
    assert ready == []
    assert max(events(records)[f"{k} spec"] for k in (1, 2)) == 1


async def test_one_failure_at_start_is_retried_and_the_run_goes_on(tmp_path: Path) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("fail-first:1", records)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.run)
        await until(lambda: ready == ["ready"])
        sup.drain()
    assert events(records)["1 spec"] == 2
    assert sup.exit_code == 0


async def test_a_child_that_does_not_drain_in_time_is_stopped(tmp_path: Path) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("stubborn", records, drain_bound=0.2)
    async with trio.open_nursery() as nursery:
        codes: list[int] = []

        async def run() -> None:
            codes.append(await sup.run())

        nursery.start_soon(run)
        await until(lambda: ready == ["ready"])
        sup.drain()
    assert codes == [0]
    seen = events(records)
    assert seen["1 drain"] == seen["1 stop"] == seen["1 exit"] == 1


async def test_stop_then_kill_for_a_child_that_ignores_both(tmp_path: Path) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("deaf", records, kill_after=0.2)
    async with trio.open_nursery() as nursery:
        codes: list[int] = []

        async def run() -> None:
            codes.append(await sup.run())

        nursery.start_soon(run)
        await until(lambda: ready == ["ready"])
        sup.drain()
        sup.stop()
    seen = events(records)
    assert seen["1 stop"] == 1 and seen["1 exit"] == 0  # it never got to exit by itself
    assert codes == [0]  # asked to stop: a killed child is what was asked for
    assert sup.pids() == {}


async def test_cancelling_the_supervisor_kills_its_children(tmp_path: Path) -> None:
    records = tmp_path / "records"
    sup, ready = supervisor("deaf", records)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.run)
        await until(lambda: ready == ["ready"])
        pids = list(sup.pids().values())
        nursery.cancel_scope.cancel()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
