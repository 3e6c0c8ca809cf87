"""Push jobs: one protocol for every kind of push, one handler that runs them all.

A push job sends one content-free message to one device: a hint
(``notify.push_send``), a read clear (``notify.push_clear``), a quiet period's
summary (``notify.push_summary``), a topic delivery (``topics.push_send``). A
kind is a :class:`PushKind` and says only what is its own:

==========  ====================================================================
parse       its stored args as a value (``None``: not what its producer writes)
plan        the checks of the whole claimed batch in one worker-thread call: each
            job is planned (a value with its :class:`~.port.Target`), skipped
            for a :class:`~bothy_notify.kernel.results.SkipReason`, or finished
            with a result of its own (``Done(Result.HELD, effect)``...)
message     the message of a planned job
delivered   what a delivery writes, when the kind writes more than its
            lifecycle does (it then does the lifecycle's write too)
route       the ``bothy_delivery_seconds{route}`` of an answer, and the event's
            append time; ``None``: not observed
==========  ====================================================================

Who the device is, and what an answer does to it, is a :class:`Lifecycle`: a
push registration's (:class:`~bothy_notify.notify.jobs.push.RegistrationLifecycle`:
strikes, invalidation, ``bothy_push_sends_total``) or a topic recipient's
(:class:`~bothy_notify.topics.send.RecipientLifecycle`).

:class:`PushJobHandler` does the rest, the same for every kind:

1. Parse every claimed job; malformed args fail that job (``malformed_args``,
   logged with the kind only).
2. Plan the batch (``plan_writes``: in one transaction; else each statement on
   its own, which saves BEGIN and COMMIT for checks that only read). Steps 1 and
   2 run in the runner's claim call, right after the claim on its connection
   (:meth:`PushJobHandler.check`, a ``runner.ChecksAtClaim``): the jobs come to
   the handler planned, with no worker-thread hop of their own. Should the
   checks fail there, the handler runs them itself.
3. Report the skips (counted in ``bothy_push_skipped_total``) and the finished
   results; send the planned jobs concurrently.
4. A send waits at most :data:`PERMIT_WAIT` for a permit of its provider's
   channel (:meth:`~.registry.Providers.try_send`); with none free the job is
   deferred (``provider_busy``, its attempt uncounted) so other providers'
   sends are not held up.
5. The answer: the lifecycle counts it and gives its effect; a non-transient
   answer is observed as the route's delivery latency. A transient outcome
   retries while attempts remain (no sooner than the provider's minimum) and
   fails after the last; every other outcome finishes the job with the
   outcome's :class:`~bothy_notify.kernel.results.Result` and the effect, which
   commits with the result (a delivery's is the kind's own when it has one).

A new kind of push is a new :class:`PushKind` and a line in ``wiring.py``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

import trio

from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.push.port import Message, Outcome, OutcomeKind, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import (
    BatchedEffect,
    Defer,
    Done,
    Effect,
    Fail,
    JobHandler,
    Report,
    retry_or_fail,
)
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job

log = logging.getLogger("bothy.push.jobs")

PERMIT_WAIT = timedelta(seconds=1)
"""How long a send waits for a permit of its provider's channel before the job goes
back to the queue (a healthy provider frees permits in milliseconds)."""
_PERMIT_WAIT_S = PERMIT_WAIT.total_seconds()
PROVIDER_BUSY = "provider_busy"
"""The defer reason of a send that found no free permit."""
MALFORMED_ARGS = "malformed_args"
"""The error of a push job whose args are not what its producer writes."""
_RANDOM = random.Random()  # noqa: S311 - spreading deferred jobs, not cryptography

RESULTS: Mapping[OutcomeKind, Result] = {
    OutcomeKind.DELIVERED: Result.DELIVERED,
    OutcomeKind.DEAD: Result.DEAD,
    OutcomeKind.MISMATCH: Result.MISMATCH,
    OutcomeKind.REJECTED: Result.REJECTED,
}
"""The result of a job that ended in a non-transient outcome."""


class Planned(Protocol):
    """What a kind plans for a job it sends: at least where the push goes."""

    @property
    def target(self) -> Target: ...


A = TypeVar("A")
"""A kind's parsed args."""
P = TypeVar("P", bound=Planned)
"""A kind's plan for a job it sends."""
P_contra = TypeVar("P_contra", bound=Planned, contravariant=True)


class PushKind(Protocol[A, P]):
    """One kind of push job: only what is its own (see the module docstring).

    A kind may subclass this protocol to take the defaults of :meth:`delivered`
    and :meth:`route` (nothing of its own) and a repr that shows nothing of its
    configuration.
    """

    kind: str
    """The job kind (``notify.push_send``...)."""
    plan_writes: bool
    """Whether :meth:`plan` writes (its statements then run in one transaction)."""

    def parse(self, args: Mapping[str, Any]) -> A | None:
        """The job's args as a value; ``None`` when they are malformed."""
        ...

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, A]], now: datetime
    ) -> dict[int, P | SkipReason | Done]:
        """Check every claimed job (blocking, in a worker thread; ``now`` is the
        clock's at the batch's start): by job id, its plan, a skip, or a result."""
        ...

    def message(self, plan: P) -> Message:
        """The message a planned job sends."""
        ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def delivered(self, plan: P) -> BatchedEffect | None:
        """What a delivery writes in place of the lifecycle's effect (which it must
        do too); ``None``: the lifecycle's."""
        return None

    def route(self, plan: P) -> tuple[str, int] | None:
        """``(route, appended_at)``: the ``bothy_delivery_seconds`` route of an answer
        and the event's append time in Unix microseconds; ``None``: not observed."""
        return None


class Lifecycle(Protocol[P_contra]):
    """What an answer does to the device a push went to, and how it is counted."""

    def answered(
        self, plan: P_contra, outcome: Outcome, *, last_attempt: bool
    ) -> Effect | BatchedEffect | None:
        """Count (and explain) one answer; its write on the device's row, committed
        with the job's result (``None``: nothing). ``last_attempt``: no attempt
        follows (a transient outcome means the send failed)."""
        ...


class PushJobHandler(Generic[A, P]):
    """Runs the jobs of one :class:`PushKind` (a runner ``JobHandler``).

    Args:
        kind: the kind.
        lifecycle: what answers do to its devices.
        db: the database its plans read.
        providers: the configured providers and their permits.
        clock: the injected clock (``now`` of each batch's plan).
        metrics: skips and delivery latency.
    """

    def __init__(
        self,
        push: PushKind[A, P],
        lifecycle: Lifecycle[P],
        *,
        db: Database,
        providers: Providers,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.kind = push.kind
        self.push = push
        self.lifecycle = lifecycle
        self._db = db
        self._providers = providers
        self._clock = clock
        self._metrics = metrics
        self._delivery = Children(metrics.delivery_seconds)

    def __repr__(self) -> str:
        return f"PushJobHandler({self.kind!r})"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        """Plan ``jobs`` in one database call, then send the planned ones concurrently;
        every job is reported once. Cancellation: the sends in flight are cancelled
        and their jobs are left unreported (the runner gives them back)."""
        now = self._clock.now()
        checks = await self._db.run(lambda conn: self.check(conn, jobs, now), transaction=False)
        await self._run_planned(checks, report)

    def check(self, conn: Conn, jobs: Sequence[Job], now: datetime) -> PushChecks[A, P]:
        """Steps 1 and 2 for ``jobs``: in the runner's claim call (``runner.ChecksAtClaim``),
        on the claim's connection, or from :meth:`run_batch`. Blocking, on a connection
        whose statements each commit on their own; a kind whose plan writes plans in a
        transaction of its own."""
        parsed = self._parse(jobs)
        plans: dict[int, P | SkipReason | Done] = {}
        if parsed.claimed:
            if self.push.plan_writes:
                with conn.transaction():
                    plans = self.push.plan(conn, parsed.claimed, now)
            else:
                plans = self.push.plan(conn, parsed.claimed, now)
        return PushChecks(parsed.claimed, parsed.malformed, plans)

    def checked(self, checks: PushChecks[A, P]) -> JobHandler:
        """A handler for the jobs :meth:`check` planned: it sends them without a
        database call of its own (a job it was not given a plan for is run as usual)."""
        return _CheckedPushes(self, checks)

    def _parse(self, jobs: Sequence[Job]) -> PushChecks[A, P]:
        """Step 1: the jobs whose args parse (with their args), and the others."""
        parse = self.push.parse
        claimed: list[tuple[Job, A]] = []
        malformed: list[Job] = []
        for job in jobs:
            args = parse(job.args)
            if args is None:
                malformed.append(job)
            else:
                claimed.append((job, args))
        return PushChecks(claimed, malformed, {})

    async def _run_planned(self, checks: PushChecks[A, P], report: Report) -> None:
        """Step 3: report the malformed, the skips and the finished; send the planned."""
        for job in checks.malformed:
            log.error("a push job has malformed args; failed", extra={"kind": self.kind})
            await report(job, Fail(MALFORMED_ARGS))
        plans = checks.plans
        async with trio.open_nursery() as nursery:
            for job, _args in checks.claimed:
                plan = plans[job.id]
                if isinstance(plan, SkipReason):
                    self._metrics.skip(plan)
                    await report(job, Done(plan.result))
                elif isinstance(plan, Done):
                    await report(job, plan)
                else:
                    nursery.start_soon(self._send, job, plan, report)

    async def _send(self, job: Job, plan: P, report: Report) -> None:
        push = self.push
        outcome = await self._providers.try_send(
            plan.target, push.message(plan), permit_wait=_PERMIT_WAIT_S
        )
        if outcome is None:
            # Give the runner slot back so other providers' sends are not held up.
            await report(job, Defer(PERMIT_WAIT * (1 + _RANDOM.random()), PROVIDER_BUSY))
            return
        effect = self.lifecycle.answered(
            plan, outcome, last_attempt=job.attempt >= job.max_attempts
        )
        kind = outcome.kind
        if kind is OutcomeKind.TRANSIENT:
            await report(
                job, retry_or_fail(job, outcome.reason or "transient", outcome.retry_after, effect)
            )
            return
        route = push.route(plan)
        if route is not None:
            self._delivery(route[0]).observe(max(0.0, time.time() - route[1] / 1_000_000))
        if kind is OutcomeKind.DELIVERED:
            delivered = push.delivered(plan)
            if delivered is not None:
                effect = delivered
        await report(job, Done(RESULTS[kind], effect))


@dataclass(frozen=True, slots=True)
class PushChecks(Generic[A, P]):
    """What a batch's checks found (:meth:`PushJobHandler.check`): the jobs whose args
    parsed, with them; the jobs whose args did not; each parsed job's plan by id."""

    claimed: list[tuple[Job, A]]
    malformed: list[Job]
    plans: dict[int, P | SkipReason | Done]

    def __repr__(self) -> str:
        return f"PushChecks(jobs={len(self.claimed) + len(self.malformed)})"


class _CheckedPushes(Generic[A, P]):
    """:class:`PushJobHandler` for jobs whose checks ran at their claim."""

    def __init__(self, handler: PushJobHandler[A, P], checks: PushChecks[A, P]) -> None:
        self.kind = handler.kind
        self._handler = handler
        self._checks = checks

    def __repr__(self) -> str:
        return f"_CheckedPushes({self.kind!r}, {self._checks!r})"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        checks = self._checks
        given = {job.id for job, _args in checks.claimed} | {job.id for job in checks.malformed}
        unchecked = [job for job in jobs if job.id not in given]
        await self._handler._run_planned(checks, report)
        if unchecked:
            await self._handler.run_batch(unchecked, report)
