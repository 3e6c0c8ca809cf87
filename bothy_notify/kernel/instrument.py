"""Hooks along a hint's path through a node, for whoever watches it (a benchmark's
stage timer: ``bench/_stages.py``).

The model is ``trio.abc.Instrument``: :class:`~bothy_notify.wiring.Daemon` takes
an optional instrument at construction and hands it to the parts that pass the
stages (the consumer round, the job runner, the gateway's publisher and
writer). Every call site is guarded by ``if instrument is not None``: without
one, a stage costs that test and nothing else. Subclass :class:`Instrument` and
override the hooks you watch; the others do nothing.

A hook is called in the thread where its stage happens (``round_*`` and
``jobs_checked`` from the round's or the runner's worker thread, the others in
the Trio thread), synchronously, on the hot path: it must be quick, must not
block, and must not raise (an exception propagates into the part that called
it). It receives what the stage handled: event payloads and job arguments as
they are (read them, never keep or change them). Hooks read no clock
themselves: the instrument does (``time.monotonic()``).

Stages, in path order:

==========================  ===============================================================
hook                        when
==========================  ===============================================================
``round_woken``             a notification ended the round's wait (before its round)
``round_started``           the round is about to read the log (its first statement)
``round_read``              it read these events (payloads), about to decide them
``round_blocked``           it found committed events behind a running transaction and
                            waits ``wait`` seconds
``round_committed``         its transaction committed (jobs and cursor)
``jobs_checked``            jobs' checks ran: the round's own gateway hints right after
                            its commit, or a runner's at its claim (arguments)
``round_handed_over``       the round's result is back in the Trio thread
``jobs_claimed``            a runner's claim returned these jobs (arguments)
``jobs_dispatched``         jobs were handed to their handler (arguments)
``frame_published``         the gateway queues an event's frame for connections (payload)
``frame_written``           a frame was written to a client's socket (its text)
==========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class Instrument:
    """Every hook does nothing; override the ones you watch (see the module docstring)."""

    def round_woken(self) -> None:
        """A notification ended the round's wait."""

    def round_started(self) -> None:
        """The round is about to read the log."""

    def round_read(self, payloads: Sequence[Mapping[str, Any]]) -> None:
        """The round read events with these payloads (in log order)."""

    def round_blocked(self, wait: float) -> None:
        """The round waits ``wait`` seconds for a transaction ahead of it."""

    def round_committed(self) -> None:
        """The round's transaction committed."""

    def jobs_checked(self, args: Sequence[Mapping[str, Any]]) -> None:
        """The checks of jobs with these arguments ran."""

    def round_handed_over(self) -> None:
        """The round's result is back in the Trio thread."""

    def jobs_claimed(self, args: Sequence[Mapping[str, Any]]) -> None:
        """A runner's claim returned jobs with these arguments."""

    def jobs_dispatched(self, args: Sequence[Mapping[str, Any]]) -> None:
        """Jobs with these arguments were handed to their handler."""

    def frame_published(self, payload: Mapping[str, Any]) -> None:
        """The gateway is about to queue the frame of an event with this payload (to
        connections of its audience that it admits)."""

    def frame_written(self, text: str) -> None:
        """A frame was written to a client's socket."""


__all__ = ["Instrument"]
