"""The clock port: every reading of wall time and every wait for a point in time.

Code never calls :func:`datetime.now` or sleeps for a delay directly; it asks a
:class:`Clock`. Production uses :class:`SystemClock`; tests use
:class:`FakeClock` and move it with :meth:`FakeClock.advance`, so no test ever
sleeps for a delay.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Protocol

import trio


class Clock(Protocol):
    """Wall time and waiting for it."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware in UTC."""
        ...

    async def sleep_until(self, when: datetime) -> None:
        """Return once :meth:`now` is at or past ``when``.

        Cancellation: a plain Trio checkpoint; cancelling returns nothing early.
        """
        ...


class SystemClock:
    """The real clock: :func:`datetime.now` in UTC and :func:`trio.sleep`."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime) -> None:
        while True:
            remaining = (when - self.now()).total_seconds()
            if remaining <= 0:
                return
            await trio.sleep(remaining)

    def __repr__(self) -> str:
        return "SystemClock()"


class FakeClock:
    """A clock that only moves when a test moves it.

    Sleepers wake when :meth:`advance` or :meth:`set` passes their deadline.
    Reading and moving it is safe from Trio tasks; :meth:`now` may also be called
    from worker threads (a datetime read is atomic).
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
        self._changed = trio.Event()

    def now(self) -> datetime:
        return self._now

    async def sleep_until(self, when: datetime) -> None:
        while self._now < when:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()

    def advance(self, delta: timedelta | float) -> datetime:
        """Move the clock forward by ``delta`` (seconds when a float) and wake sleepers."""
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        if delta < timedelta(0):
            raise ValueError("a clock only moves forward")
        return self.set(self._now + delta)

    def set(self, when: datetime) -> datetime:
        """Move the clock to ``when`` (never backwards) and wake sleepers."""
        if when < self._now:
            raise ValueError("a clock only moves forward")
        self._now = when
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        return self._now

    def __repr__(self) -> str:
        return f"FakeClock({self._now.isoformat()})"


@functools.lru_cache(maxsize=1024)
def to_unix_micros(when: datetime) -> int:
    """Microseconds since the Unix epoch, the integer form that job args carry."""
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_unix_micros(micros: int) -> datetime:
    """The inverse of :func:`to_unix_micros`."""
    return _EPOCH + timedelta(microseconds=micros)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
