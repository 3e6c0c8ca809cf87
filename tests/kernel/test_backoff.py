"""The one backoff rule (``kernel/backoff.py``), as tables: no IO, no clock.

Each user's values are the ones it had before the rule was shared: supervision
and node processes 0.5 s doubling to 30 s (again from 0.5 s after 30 s up),
reconnections the poll interval doubling to 5 s, job retries 1 s doubling to 10
minutes with half of each delay random, result recording 50 ms doubling to 5 s,
the round's blocked wait 5 ms doubling to the poll interval.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from bothy_notify.kernel.backoff import Backoff, restart_backoff
from bothy_notify.kernel.supervise import Supervised
from bothy_notify.notify.round import blocked_backoff
from bothy_notify.processes.control import ChildSpec
from bothy_notify.processes.supervisor import Supervisor
from bothy_notify.runner import JOB_RETRY, RECORD_RETRY, backoff
from bothy_notify.store.listen import reconnect_backoff


def waits(policy: Backoff, n: int) -> list[float]:
    retries = policy.retries()
    return [retries.failed() for _ in range(n)]


async def _service(*, task_status: object) -> None: ...


def _spec(ordinal: int) -> ChildSpec:
    raise AssertionError("no child is started here")


SUPERVISION = Supervised("service", _service).backoff
NODE_PROCESSES = Supervisor(count=1, command=["true"], spec=_spec, env={}, drain_bound=1).backoff


def test_services_and_node_processes_restart_by_one_rule() -> None:
    assert SUPERVISION == NODE_PROCESSES == restart_backoff()
    assert SUPERVISION.reset_after == SUPERVISION.cap == 30


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (SUPERVISION, [0.5, 1, 2, 4, 8, 16, 30, 30]),
        (NODE_PROCESSES, [0.5, 1, 2, 4, 8, 16, 30, 30]),
        (reconnect_backoff(1.0), [1, 2, 4, 5, 5, 5, 5, 5]),
        (reconnect_backoff(0.05), [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5]),
        (reconnect_backoff(10.0), [10] * 8),  # a poll interval past the cap stays as it is
        (RECORD_RETRY, [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5]),
        (blocked_backoff(1.0), [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64]),
        (blocked_backoff(0.02), [0.005, 0.01, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02]),
        (Backoff(initial=1, cap=100, factor=3), [1, 3, 9, 27, 81, 100, 100, 100]),
        (Backoff(initial=2, cap=2, factor=1), [2] * 8),
    ],
)
def test_the_waits_after_failures_in_a_row(policy: Backoff, expected: list[float]) -> None:
    assert waits(policy, len(expected)) == pytest.approx(expected)


def test_a_success_starts_from_the_first_wait_again() -> None:
    retries = reconnect_backoff(1.0).retries()
    assert [retries.failed() for _ in range(3)] == [1, 2, 4]
    retries.succeeded()
    assert [retries.failed() for _ in range(2)] == [1, 2]


@pytest.mark.parametrize(
    ("up_for", "expected"),
    [
        (None, 4.0),  # failed at start: no reset
        (0.0, 4.0),
        (29.9, 4.0),
        (30.0, 0.5),  # stayed up for the cap: this failure is the first again
        (3600.0, 0.5),
    ],
)
def test_a_failure_after_a_long_enough_run_is_the_first_again(
    up_for: float | None, expected: float
) -> None:
    retries = SUPERVISION.retries()
    assert [retries.failed(up_for=0.1) for _ in range(3)] == [0.5, 1, 2]
    assert retries.failed(up_for=up_for) == expected


def test_without_reset_after_only_a_success_resets() -> None:
    retries = reconnect_backoff(1.0).retries()
    retries.failed()
    assert retries.failed(up_for=1e9) == 2


@pytest.mark.parametrize(
    ("failures", "draw", "expected"),
    [
        (0, 0.0, 0.5),  # jitter 0.5: the delay times [0.5, 1)
        (0, 0.5, 0.75),
        (0, 0.999, 0.9995),
        (3, 0.0, 4.0),
        (3, 0.5, 6.0),
        (20, 0.0, 300.0),  # the cap before jitter: 10 minutes
        (20, 0.999, 599.7),
    ],
)
def test_jitter_takes_a_fraction_of_the_delay(failures: int, draw: float, expected: float) -> None:
    assert JOB_RETRY.delay(failures, draw) == pytest.approx(expected)


def test_job_retries_keep_their_values() -> None:
    """``runner.backoff(attempt)``: ``1 s * 2**(attempt-1)``, capped at 10 min, times
    [0.5, 1), as before the rule was shared."""
    for attempt in range(1, 30):
        rng, again = random.Random(attempt), random.Random(attempt)
        exp = min(timedelta(minutes=10), timedelta(seconds=1) * (1 << (attempt - 1)))
        before = exp * (0.5 + again.random() / 2)
        assert backoff(attempt, rng).total_seconds() == pytest.approx(before.total_seconds())


def test_thousands_of_failures_stay_at_the_cap_without_overflow() -> None:
    assert SUPERVISION.delay(100_000) == 30
    retries = SUPERVISION.retries()
    for _ in range(5000):
        assert retries.failed() <= 30
    assert retries.failures < 10  # the count stops growing at the cap


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial": 0, "cap": 1}, "initial"),
        ({"initial": 2, "cap": 1}, "cap"),
        ({"initial": 1, "cap": 2, "factor": 0.5}, "factor"),
        ({"initial": 1, "cap": 2, "reset_after": -1}, "reset_after"),
        ({"initial": 1, "cap": 2, "jitter": 1.5}, "jitter"),
    ],
)
def test_a_value_out_of_range_is_refused_by_name(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Backoff(**kwargs)
