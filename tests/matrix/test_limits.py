"""The Matrix gateway's rate limit: a token bucket per source address."""

from __future__ import annotations

import pytest

from bothy_notify.matrix.limits import SourceLimits, retry_after_ms


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_the_rate_holds() -> None:
    clock = Clock()
    limits = SourceLimits(per_second=2, burst=3, now=clock)
    assert [limits.take("10.0.0.1") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limits.take("10.0.0.1") == pytest.approx(0.5)
    clock.now += 0.5
    assert limits.take("10.0.0.1") == 0.0
    assert limits.take("10.0.0.1") == pytest.approx(0.5)


def test_one_address_over_its_rate_never_holds_another() -> None:
    limits = SourceLimits(per_second=1, burst=1, now=Clock())
    assert limits.take("10.0.0.1") == 0.0
    assert limits.take("10.0.0.1") > 0
    assert limits.take("10.0.0.2") == 0.0


def test_a_refused_request_takes_no_token() -> None:
    clock = Clock()
    limits = SourceLimits(per_second=1, burst=1, now=clock)
    limits.take("a")
    for _ in range(5):
        assert limits.take("a") > 0
    clock.now += 1.0
    assert limits.take("a") == 0.0


def test_the_buckets_are_bounded_full_ones_forgotten_first() -> None:
    clock = Clock()
    limits = SourceLimits(per_second=1, burst=2, now=clock, addresses=3)
    limits.take("busy")
    limits.take("busy")
    limits.take("idle-1")
    limits.take("idle-2")
    clock.now += 5.0  # the idle ones refill; "busy" too, but it is taken again now
    limits.take("busy")
    limits.take("busy")
    limits.take("new")  # full: the refilled buckets go
    assert limits.take("busy") > 0  # its state was kept


def test_retry_after_is_whole_milliseconds_at_least_one() -> None:
    assert retry_after_ms(0.0001) == 1
    assert retry_after_ms(0.25) == 250
    assert retry_after_ms(1.0001) == 1001
