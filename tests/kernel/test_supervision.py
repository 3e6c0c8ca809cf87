"""Supervision: a failing service is restarted with backoff, never the daemon; while
it waits for its restart, its readiness is false. Time is Trio's autojump clock."""

from __future__ import annotations

import itertools
import logging
import re

import pytest
import trio
import trio.testing

from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.supervise import Supervised, error_type, error_where


class Flaky:
    """Fails ``failures`` times (after starting), then runs until cancelled."""

    def __init__(self, failures: int, *, before_start: bool = False) -> None:
        self.failures = failures
        self.before_start = before_start
        self.starts: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        failing = len(self.starts) <= self.failures
        if failing and self.before_start:
            raise RuntimeError("refused: user-42")
        task_status.started("ready")
        if failing:
            raise RuntimeError("broke: user-42")
        await trio.sleep_forever()


def is_up(supervised: Supervised) -> bool:
    return supervised.up


async def test_a_failing_service_restarts_with_exponential_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flaky = Flaky(failures=3)
    metrics = Metrics()
    supervised = Supervised("flaky", flaky.run, metrics=metrics)
    async with trio.open_nursery() as nursery:
        assert await nursery.start(supervised.run) == "ready"
        await trio.sleep(10)
        gaps = [b - a for a, b in itertools.pairwise(flaky.starts)]
        assert gaps == pytest.approx([0.5, 1.0, 2.0])
        assert supervised.up and supervised.restarts == 3
        assert supervised.last_error == "RuntimeError"
        assert 'bothy_service_restarts_total{service="flaky"} 3.0' in metrics.render().decode()
        nursery.cancel_scope.cancel()
    assert not supervised.up


async def test_a_service_is_down_while_it_waits_for_its_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flaky = Flaky(failures=1)
    supervised = Supervised("flaky", flaky.run)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervised.run)
        await trio.sleep(0.25)  # failed at once; restarts at 0.5
        assert not is_up(supervised)
        await trio.sleep(0.5)
        assert is_up(supervised)
        nursery.cancel_scope.cancel()


async def test_started_waits_for_the_first_successful_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    flaky = Flaky(failures=2, before_start=True)
    supervised = Supervised("flaky", flaky.run)
    async with trio.open_nursery() as nursery:
        began = trio.current_time()
        await nursery.start(supervised.run)
        assert trio.current_time() - began == pytest.approx(1.5)
        assert len(flaky.starts) == 3 and supervised.up
        nursery.cancel_scope.cancel()


async def test_the_backoff_starts_again_after_a_long_good_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts: list[float] = []

    async def fails_after_a_while(*, task_status: trio.TaskStatus[None]) -> None:
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(0 if len(starts) < 3 else 6)
        raise RuntimeError("again")

    supervised = Supervised("sometimes", fails_after_a_while, max_delay=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervised.run)
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # 0.5 and 1.0 while failing at once; then up for 6 s (past max_delay), so the
    # wait is back to 0.5 after each such run.
    assert gaps[:4] == pytest.approx([0.5, 1.0, 6.5, 6.5])


async def test_a_service_that_returns_ends_its_supervisor() -> None:
    async def finishes(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()

    supervised = Supervised("once", finishes)
    with trio.fail_after(5):
        await supervised.run()
    assert supervised.restarts == 0 and not supervised.up


async def test_a_failure_is_logged_by_type_never_by_message(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = Flaky(failures=1)
    with caplog.at_level(logging.ERROR, logger="bothy"):
        async with trio.open_nursery() as nursery:
            await nursery.start(Supervised("flaky", flaky.run).run)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    [record] = [r for r in caplog.records if r.name == "bothy.supervise"]
    assert record.__dict__["service"] == "flaky"
    assert record.__dict__["error_type"] == "RuntimeError"
    assert "user-42" not in f"{record.getMessage()} {record.__dict__}"
    assert record.exc_info is None


def test_error_type_names_the_cause_and_error_where_a_code_location() -> None:
    def inner() -> None:
        raise KeyError("user-42")

    try:
        try:
            inner()
        except KeyError as exc:
            raise ValueError("wrapped") from exc
    except ValueError as exc:
        assert error_type(exc) == "ValueError(KeyError)"
        # Outside the project's packages: the file name only, with line and function.
        assert re.fullmatch(r"test_supervision\.py:\d+ in inner", error_where(exc))
