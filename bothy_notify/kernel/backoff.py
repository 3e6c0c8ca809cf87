"""Exponential backoff: the one rule for waiting before trying again.

A :class:`Backoff` is a policy (a frozen value, no IO, no clock): the n-th wait
is ``initial * factor**n``, capped at ``cap``, and with ``jitter`` multiplied by
a draw from ``[1 - jitter, 1)``. A :class:`Retries` follows one policy for one
thing that fails and recovers:

- :meth:`Retries.failed` gives the wait after a failure and counts it;
- :meth:`Retries.succeeded` starts again from ``initial`` (a connection that
  came back);
- with ``reset_after``, a failure of a run that had stayed up that long counts
  as the first again (``failed(up_for=...)``): a service that fails once a day
  waits ``initial``, not ``cap``.

Who uses which values (the constants say why at their definitions):

=============================  =========================  ==========================
who                            initial -> cap             reset
=============================  =========================  ==========================
``kernel.supervise``           0.5 s doubling to 30 s     after 30 s up
``processes.supervisor``       0.5 s doubling to 30 s     after 30 s ready
``store.listen`` (reconnect)   ``notify.poll_interval``   on every connection
                               doubling to 5 s (or the
                               poll interval if longer)
``runner`` job retries         1 s doubling to 10 min,    per job (its attempt)
                               jitter 0.5
``runner`` recording results   50 ms doubling to 5 s      per batch
``notify.round`` blocked       5 ms doubling to           once not blocked
                               ``notify.poll_interval``
=============================  =========================  ==========================
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_RANDOM = random.Random()  # noqa: S311 - jitter, not cryptography

RESTART_FIRST = 0.5
"""Seconds before a failed service or node process is started again: long enough not
to spin on a failure that repeats at once, short enough that a one-off costs little."""
RESTART_MAX = 30.0
"""Longest wait between restarts, in seconds; also how long a run must stay up for its
next failure to wait :data:`RESTART_FIRST` again."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """An exponential backoff policy.

    Args:
        initial: the first wait, in seconds (> 0).
        cap: the longest wait, in seconds (>= ``initial``).
        factor: how much each wait grows over the one before (>= 1).
        reset_after: seconds a run must have stayed up for its failure to count
            as the first again (``None``: only :meth:`Retries.succeeded` resets).
        jitter: the fraction of each wait that is random: the wait is multiplied
            by a draw from ``[1 - jitter, 1)`` (0: none; at most 1).

    Raises:
        ValueError: a value out of its range (naming it).
    """

    initial: float
    cap: float
    factor: float = 2.0
    reset_after: float | None = None
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not self.initial > 0:
            raise ValueError("backoff initial must be > 0")
        if not self.cap >= self.initial:
            raise ValueError("backoff cap must be >= initial")
        if not self.factor >= 1:
            raise ValueError("backoff factor must be >= 1")
        if self.reset_after is not None and self.reset_after < 0:
            raise ValueError("backoff reset_after must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter must be between 0 and 1")

    def delay(self, failures: int, draw: float | None = None) -> float:
        """The wait after ``failures`` earlier failures in a row (0: the first wait).

        ``draw`` in ``[0, 1)`` is the jitter's random number (drawn here when
        ``None`` and the policy has jitter); pure when given.
        """
        wait = self.ceiling(failures)
        if not self.jitter:
            return wait
        if draw is None:
            draw = _RANDOM.random()
        return wait * (1 - self.jitter + self.jitter * draw)

    def ceiling(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row before jitter: capped, never
        overflowing."""
        try:
            return min(self.cap, self.initial * self.factor ** max(0, failures))
        except OverflowError:  # thousands of failures in a row: long past the cap
            return self.cap

    def retries(self) -> Retries:
        """A fresh :class:`Retries` following this policy."""
        return Retries(self)


def restart_backoff(first: float = RESTART_FIRST, longest: float = RESTART_MAX) -> Backoff:
    """The restart rule of ``kernel.supervise.Supervised`` and of
    ``processes.supervisor.Supervisor``: ``first`` doubling to ``longest``, and the
    first again after a run that stayed up ``longest`` (tests shorten both)."""
    return Backoff(initial=first, cap=longest, reset_after=longest)


class Retries:
    """The failures in a row of one thing that follows a :class:`Backoff`.

    Not thread-safe; one owner (a service's loop).
    """

    __slots__ = ("failures", "policy")

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self.failures = 0
        """Failures in a row since the last reset (it stops growing at the cap)."""

    def __repr__(self) -> str:
        return f"Retries(failures={self.failures})"

    def failed(self, *, up_for: float | None = None, draw: float | None = None) -> float:
        """Count a failure; returns how long to wait before trying again.

        Args:
            up_for: how long the run that just failed had been up (``None``: it
                never came up, for example a failure at start). At least the
                policy's ``reset_after`` makes this failure the first again.
            draw: the jitter's random number (tests), see :meth:`Backoff.delay`.
        """
        reset_after = self.policy.reset_after
        if up_for is not None and reset_after is not None and up_for >= reset_after:
            self.failures = 0
        wait = self.policy.delay(self.failures, draw)
        if self.policy.ceiling(self.failures) < self.policy.cap:
            self.failures += 1  # at the cap the count no longer matters (nor overflows)
        return wait

    def succeeded(self) -> None:
        """It worked: the next failure waits ``initial`` again."""
        self.failures = 0


__all__ = ["RESTART_FIRST", "RESTART_MAX", "Backoff", "Retries", "restart_backoff"]
