"""The job runner: claims due jobs, runs their handlers, records results.

Jobs are claimed in batches (``FOR UPDATE SKIP LOCKED``) up to
``jobs.concurrency`` running per node, grouped by kind and handed to that
kind's :class:`JobHandler` as one batch (so a handler can read its facts with
one query). Each job's result goes to a completer task that records results in
batches, each batch in one transaction together with the handler's effects
(for example a registration's strike count), so an effect and its job's state
commit together.

A job holds its concurrency slot until its result is reported (handed to the
completer), not until it is recorded: the claim loop claims the next jobs
while the last ones are being recorded. The jobs claimed and not yet recorded
are kept apart (``_in_flight``): their leases are renewed. A result is noted
(``_reported``) the moment its handler reports it, before anything awaits, and
stays noted until it is recorded. The results channel (``jobs.concurrency``
deep) bounds how far reporting runs ahead of recording.

Claimed jobs keep their lease while they run (a renewal task extends it), so
only a crashed node's jobs run again. On shutdown the runner stops claiming and
lets running jobs finish within the drain period. When the period is over (or
the runner fails) the handlers are cancelled first; then, in a shielded and
bounded cleanup, the results reported by then are recorded, wherever they were
(in the channel, in the completer's batch, in a retry of the recording, or
held by a handler waiting for room in the channel): an effect that already
happened, such as a push the provider accepted, is never given back to run
again. Only the jobs that never reported are given back, uncounted. If the
database cannot be reached at that moment nothing can be recorded: those jobs
run again when their lease ends (at least once, never lost). A recording whose
connection broke is written again on a fresh connection while its fences hold
(:meth:`JobRunner._apply`); at a stop those retries end with the cleanup's bound.

Fencing: a result applies only to the run that claimed the job. Each claim
takes the job's next claim number (``Job.claim``), and every write about the
job (complete, fail, retry, defer, renew, release) matches ``(id, claim)``
while the job is running. A runner that lost its lease (it stalled, the
housekeeper made the job available, another runner claimed it) therefore
changes nothing: its state write matches no row, and the result's ``effect``
(for example a registration's token-lifecycle update) is applied only for the
results whose fence held, in the same transaction. Such a result counts as
``bothy_jobs_finished_total{result="lost_lease"}``. Handlers keep expressing
their effects as ``Done/Retry/Fail(effect=...)`` (a plain :data:`Effect` or a
:class:`BatchedEffect`); the runner alone decides whether they apply.

An effect that raises (a bug, a row it cannot write) never stops the runner:
the batch is recorded again one result at a time, and the result whose effect
fails is recorded as :class:`Fail` (``effect_error:<type>``) without it.

Results:

- :class:`Done`: finished (delivered, or skipped for a reason).
- :class:`Retry`: run again after ``after`` (a retry holds no permit while it waits).
- :class:`Fail`: give up; the job is kept as ``failed`` with its error.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol, runtime_checkable

import trio

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.backoff import Backoff
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.kernel.supervise import Supervised, error_type
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import (
    Conn,
    Database,
    StoreContention,
    StoreError,
    StoreUnavailable,
)
from bothy_notify.store.jobs import Fence, Job
from bothy_notify.store.listen import (
    Listener,
    Listening,
    Notification,
    delivering,
    reconnect_backoff,
)

log = logging.getLogger("bothy.runner")

Effect = Callable[[Conn, datetime], None]
"""A write that commits together with the job's result (``conn``, the clock's now)."""


@dataclass(frozen=True, slots=True)
class BatchedEffect:
    """An effect applied together with every other of the same ``apply`` in the batch.

    ``apply(conn, items, now)`` runs once per recorded batch with the ``item`` of
    each such result (for example one ``UPDATE ... WHERE id = ANY(...)`` for all
    delivered registrations instead of one statement per job). Batched effects
    run after the plain ones of the same batch.
    """

    apply: Callable[[Conn, list[Any], datetime], None]
    item: Any


@dataclass(frozen=True, slots=True)
class Done:
    """The job is finished; ``result`` labels the metric (``delivered``, ``skipped_read``...)."""

    result: Result = Result.DONE
    effect: Effect | BatchedEffect | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """Run the job again no sooner than ``after``; ``error`` is a constant reason code."""

    after: timedelta
    error: str
    effect: Effect | BatchedEffect | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Give the job up."""

    error: str
    effect: Effect | BatchedEffect | None = None


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now, and not the job's fault: run it again after ``after`` with this
    attempt uncounted (for example: its provider has no free permit)."""

    after: timedelta
    reason: str


JobResult = Done | Retry | Fail | Defer
Report = Callable[[Job, JobResult], Awaitable[None]]


class JobHandler(Protocol):
    """Runs the jobs of one kind."""

    kind: str

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        """Run ``jobs`` (all of this kind) and ``report`` each one's result exactly once.

        Cancellation (shutdown past the drain period): jobs not reported yet are
        given back and run again later.
        """
        ...


@runtime_checkable
class ChecksAtClaim(Protocol):
    """A :class:`JobHandler` whose first step is one blocking statement over its
    batch (``notify.gateway_send``'s check). The runner runs it in the worker
    thread that claimed the jobs, right after the claim, and hands the jobs to
    the handler :meth:`checked` returns: one worker-thread hop and one wake-up
    less between the claim and the job's work."""

    kind: str

    def check(self, conn: Conn, jobs: Sequence[Job], now: datetime) -> Any:
        """The check for ``jobs`` on ``conn`` (blocking; may raise)."""
        ...

    def checked(self, verdicts: Any) -> JobHandler:
        """A handler that runs jobs whose :meth:`check` gave ``verdicts``."""
        ...


BACKOFF_BASE = timedelta(seconds=1)
"""First retry delay before jitter; doubles per attempt."""
BACKOFF_CAP = timedelta(minutes=10)
"""Longest retry delay from backoff alone (a provider's minimum may be longer)."""
JOB_RETRY = Backoff(
    initial=BACKOFF_BASE.total_seconds(), cap=BACKOFF_CAP.total_seconds(), jitter=0.5
)
"""A job's retries: half of each delay is random, so jobs that failed together (a
provider's outage) do not come back together."""

RECORD_RETRY = Backoff(initial=0.05, cap=5.0)
"""Recording results while the database is unreachable: soon at first (most losses
are a moment's), then no more than every 5 s."""

CHECK_ATTEMPTS = 8
"""Attempts to ask whether a recording cut off had committed (:data:`RECORD_RETRY`'s
waits between them: about 6 s in all)."""

RENEW_RETRY = Backoff(initial=0.25, cap=2.0)
"""Renewing leases after a renewal failed (the connection broke, or the server did not
answer): again soon rather than a period later, so a failover that takes most of a
lease still finds the leases renewed on the new primary (the next period's wait is
the longest)."""


def backoff(attempt: int, rng: random.Random | None = None) -> timedelta:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)``, capped, times [0.5, 1)."""
    return timedelta(seconds=JOB_RETRY.delay(attempt - 1, rng.random() if rng else None))


def retry_or_fail(
    job: Job,
    error: str,
    minimum: timedelta | None = None,
    effect: Effect | BatchedEffect | None = None,
) -> JobResult:
    """:class:`Retry` after ``max(minimum, backoff)`` while attempts remain, else :class:`Fail`."""
    if job.attempt >= job.max_attempts:
        return Fail(error, effect)
    after = backoff(job.attempt)
    if minimum is not None and minimum > after:
        after = minimum
    return Retry(after, error, effect)


STOP_RECORD_BOUND = 5.0
"""Seconds the cleanup of a stop spends recording the results reported before it;
past it the rest are given back (they run again: at least once)."""
STOP_RELEASE_BOUND = 5.0
"""Seconds the cleanup of a stop spends giving back the jobs that never reported; past
it their leases end instead. With :data:`STOP_RECORD_BOUND` the cleanup fits well
inside the 15 s a ``run --processes`` parent grants a node after its drain period."""

_COMPLETE_BATCH = 500
"""Most results recorded in one transaction."""
_RECORD_LINGER = 0.01
"""Seconds the recorder waits for more results when several are already queued; a
lone result is recorded at once. Fewer, larger transactions keep the worker threads
from contending with the event loop at high rates, but runner slots stay taken
until their job is recorded: at high push rates a 50 ms wait cost throughput for no
CPU saved, this one does not (``bench/push.py``)."""


CLAIMED_ROOM = 4
"""Jobs handed over already claimed (the round's local gateway hints) may fill up to
this many times ``jobs.concurrency``: they are published in memory within a turn of
the loop, and what keeps them in flight is the recording of their results. A round
at a high hint rate hands over hundreds at once; bounded by ``jobs.concurrency``
alone, the next round's hints went to the claim loop (two more queries and three
thread hops each, more CPU per hint in ``bench/gateway.py``). The claim loop still claims
only while fewer than ``jobs.concurrency`` are in flight."""


class JobRunner:
    """Runs jobs of the registered kinds on this node.

    Args:
        db: the pool.
        database_url: for the dedicated ``LISTEN bothy_jobs`` connection.
        clock: the injected clock (schedules, leases).
        handlers: one handler per job kind.
        config: ``jobs.*``.
        poll_interval: fallback poll when no notification arrives.
        metrics: the registry.
        node_id: this node's id in a cluster (``cluster.mode = "multi"``): jobs
            targeted at other nodes are not claimed. ``None`` on a single node.
        instrument: told of claims, checks and dispatches
            (:mod:`bothy_notify.kernel.instrument`).
    """

    def __init__(
        self,
        *,
        db: Database,
        database_url: str,
        clock: Clock,
        handlers: Sequence[JobHandler],
        config: JobsConfig,
        poll_interval: timedelta,
        metrics: Metrics,
        node_id: str | None = None,
        instrument: Instrument | None = None,
    ) -> None:
        self._db = db
        self._node_id = node_id
        self._instrument = instrument
        self._clock = clock
        self._handlers: Mapping[str, JobHandler] = {h.kind: h for h in handlers}
        self._check_at_claim: Mapping[str, ChecksAtClaim] = {
            h.kind: h for h in handlers if isinstance(h, ChecksAtClaim)
        }
        self._config = config
        self._poll = poll_interval.total_seconds()
        self._metrics = metrics
        self._finished = Children(metrics.jobs_finished)
        self._in_flight: dict[Fence, Job] = {}
        """Claimed and not yet recorded: renewed; given back at a stop unless reported."""
        self._lost: set[Fence] = set()
        """In flight, and a renewal found the fence lost: recording them stops retrying."""
        self._reported: dict[Fence, tuple[Job, JobResult]] = {}
        """Results reported and not yet recorded (a subset of ``_in_flight``): a stop
        records them before giving anything back."""
        self._record_by = math.inf
        """When recording must end (Trio time): never while the runner works; set by a
        stop (:meth:`_bound_recording`)."""
        self._recording: trio.CancelScope | None = None
        """The shielded scope of a completion statement in flight."""
        self._running = 0
        """Claimed and not yet reported: the jobs holding a ``jobs.concurrency`` slot."""
        self._wake = trio.Event()
        self._freed = trio.Event()
        self._stopping = False
        self._claiming = False
        """A claim query is in flight: the jobs it claims are not in ``_in_flight`` yet."""
        self._idle = trio.Event()
        self._results_send, self._results_recv = trio.open_memory_channel[tuple[Job, JobResult]](0)
        self._jobs_listener = Listener(
            database_url,
            (queue.JOBS_CHANNEL,),
            name="runner",
            reconnect=reconnect_backoff(self._poll),
            catch_up=self._catch_up,
            timeouts=db.timeouts,
        )
        self._listener = Supervised("runner.listen", self._listen_loop, metrics=metrics)
        self._renewer = Supervised("runner.renew", self._renew_loop, metrics=metrics)
        self._work: trio.Nursery | None = None
        self.running = False
        self._claim_failing = False
        self._claims = self._claimed = self._records = self._recorded = 0
        self.lost_leases = 0
        """Results dropped because another claim held the job by then (statistics)."""

    def __repr__(self) -> str:
        return f"JobRunner(in_flight={len(self._in_flight)})"

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def statistics(self) -> dict[str, int]:
        """``in_flight``: claimed, not yet recorded; ``running``: not yet reported;
        ``claims``/``claimed``: claim queries that found jobs and the jobs they
        found; ``records``/``recorded``: result batches recorded and their results
        (since the runner was made)."""
        return {
            "in_flight": len(self._in_flight),
            "running": self._running,
            "claims": self._claims,
            "claimed": self._claimed,
            "records": self._records,
            "recorded": self._recorded,
        }

    def nudge(self) -> None:
        """Wake the claim loop (new jobs may be due)."""
        self._wake.set()

    def room(self) -> int:
        """How many jobs this runner takes from :meth:`run_claimed` now: 0 unless it
        runs and claims, else up to :data:`CLAIMED_ROOM` times ``jobs.concurrency``
        in flight in all.

        Only reads counters, so the consumer round may ask from its worker
        thread (the answer may be a little stale; :meth:`run_claimed` takes
        what it is given regardless).
        """
        if not self.running or self._stopping or self._work is None:
            return 0
        return max(0, CLAIMED_ROOM * self._config.concurrency - len(self._in_flight))

    def run_claimed(self, jobs: Sequence[Job], handler: JobHandler | None = None) -> bool:
        """Run ``jobs`` that this node claimed itself, outside the claim loop.

        The consumer round inserts its local gateway hints already claimed
        (``store.jobs.ClaimHere``) and hands them over here after its commit, so
        they start without a claim round trip. From here on they are the
        runner's like any claimed job: their lease is renewed, their results
        are recorded (fenced), and a shutdown gives back those not finished.

        Args:
            jobs: claimed jobs of one kind (their ``claim`` is the fence).
            handler: runs them instead of the kind's registered handler (for
                example one that has their checks done already).

        Returns:
            False when the runner is not running or stops claiming: nothing was
            taken, and the caller gives the jobs back (or leaves them to their
            lease). Call in the Trio thread.
        """
        work = self._work
        if not jobs or not self.running or self._stopping or work is None:
            return False
        kind = jobs[0].kind
        for job in jobs:
            self._in_flight[job.fence] = job
        self._running += len(jobs)
        if self._instrument is not None:
            self._instrument.jobs_dispatched([job.args for job in jobs])
        work.start_soon(self._run_group, handler or self._handlers[kind], list(jobs))
        return True

    def stop_claiming(self) -> None:
        """Begin a graceful stop: claim nothing more; :meth:`wait_idle` returns once
        running jobs are recorded (the jobs of a claim in flight included)."""
        self._stopping = True
        self._wake.set()
        if not self._in_flight and not self._claiming:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled (or stopped and idle).

        Cancellation: handlers are cancelled; then, in a shielded cleanup, the
        results already reported are recorded (within :data:`STOP_RECORD_BOUND`)
        and the jobs that never reported are given back (within
        :data:`STOP_RELEASE_BOUND`; they run again, the attempt uncounted). The
        same happens when the runner fails; its supervisor (``wiring``) then
        starts it again. The ``LISTEN`` and lease-renewal loops are supervised
        on their own: either restarts without disturbing running jobs.
        """
        # A fresh channel per run: results of a run that failed are never recorded by
        # the next one (their jobs were given back, or their fence no longer holds).
        self._results_send, self._results_recv = trio.open_memory_channel[tuple[Job, JobResult]](
            self._config.concurrency
        )
        self._idle = trio.Event()
        self._running = 0
        self._reported = {}
        self._record_by = math.inf
        try:
            async with trio.open_nursery() as services:
                services.start_soon(self._complete_loop)
                await services.start(self._listener.run)
                services.start_soon(self._renewer.run)
                try:
                    async with trio.open_nursery() as work:
                        self._work = work
                        self.running = True
                        task_status.started()
                        await self._claim_loop(work)
                        await self._idle.wait()
                finally:
                    # The handlers have ended (finished, cancelled by a stop, or by a
                    # failure): the recording still in flight gets a bound.
                    self._bound_recording()
                services.cancel_scope.cancel()
        finally:
            # Every handler and the completer have ended here (their nurseries are
            # closed): what they reported is in _reported, and nothing else records.
            self.running = False
            self._work = None
            self._running = 0
            with trio.CancelScope(shield=True):
                await self._record_reported()
                await self._give_back()

    def _bound_recording(self) -> None:
        """The work is over: recording (the statement in flight, then the cleanup's)
        ends within :data:`STOP_RECORD_BOUND` from now."""
        self._record_by = trio.current_time() + STOP_RECORD_BOUND
        if self._recording is not None:
            self._recording.deadline = self._record_by

    async def _record_reported(self) -> None:
        """At a stop: record the results reported and not yet recorded, so that no
        job whose effect already happened is given back. Ends by ``_record_by``
        (:data:`STOP_RECORD_BOUND` after the handlers ended); call shielded."""
        pending = list(self._reported.values())
        if not pending:
            return
        with trio.CancelScope(
            deadline=min(self._record_by, trio.current_time() + STOP_RECORD_BOUND)
        ):
            try:
                await self._record(pending)
            except StoreError:
                pass
            else:
                log.info("recorded results reported before the stop", extra={"jobs": len(pending)})
                return
        self._reported.clear()
        log.warning(
            "could not record results reported before the stop; their jobs run again",
            extra={"jobs": len(pending)},
        )

    async def _give_back(self) -> None:
        """At a stop: give back the jobs claimed here that never reported (fenced, the
        attempt uncounted). Bounded by :data:`STOP_RELEASE_BOUND`; call shielded."""
        fences = list(self._in_flight)
        self._in_flight.clear()
        self._reported.clear()
        self._lost.clear()
        if not fences:
            return
        with trio.move_on_after(STOP_RELEASE_BOUND):
            try:
                await self._db.run(lambda c: queue.release(c, fences))
            except StoreError:
                pass
            else:
                log.info("gave back unfinished jobs", extra={"jobs": len(fences)})
                return
        log.warning("could not give back unfinished jobs; their leases will end")

    @property
    def healthy(self) -> bool:
        """Running, with its ``LISTEN`` and renewal loops up, its ``LISTEN``
        connection open and its last claim answered (``/readyz``)."""
        return (
            self.running
            and self._listener.up
            and self._renewer.up
            and self._jobs_listener.connected
            and not self._claim_failing
        )

    async def _claim_loop(self, work: trio.Nursery) -> None:
        kinds = self.kinds
        while not self._stopping:
            free = self._config.concurrency - self._running
            if free <= 0:
                # A report frees a slot (set in _run_group's report).
                self._freed = freed = trio.Event()
                await freed.wait()
                continue
            wake = self._wake
            if wake.is_set():
                self._wake = wake = trio.Event()
            limit = min(free, self._config.claim_batch)
            now = self._clock.now()
            # Until its jobs are dispatched (no checkpoint between), a stop that
            # begins meanwhile waits for them: idle now would end the drain at once
            # and cancel their sends as they go out.
            try:
                self._claiming = True
                try:
                    jobs, due, checked = await self._db.run(
                        partial(self._claim, now=now, limit=limit, kinds=kinds),
                        transaction=False,  # the claim is one statement; the peek a read
                    )
                finally:
                    self._claiming = False
            except StoreUnavailable:
                log.warning("claiming jobs failed; retrying once the database answers")
                self._claim_failing = True
                # As soon as another statement of the pool gets through (the database
                # is back), not a whole poll interval later.
                await self._db.answer_after(trio.current_time(), self._poll)
                continue
            except StoreError:
                log.warning("claiming jobs failed; retrying after the poll interval")
                self._claim_failing = True
                await trio.sleep(self._poll)
                continue
            self._claim_failing = False
            if jobs:
                self._claims += 1
                self._claimed += len(jobs)
                self._dispatch(work, jobs, checked)
            if len(jobs) == limit:
                await trio.lowlevel.checkpoint()
                continue
            # Nothing more is due now: sleep until the next job is, or a new one arrives
            # (the wake event was taken before the claim, so nothing slips between).
            await self._wait(wake, due)
        if not self._in_flight:
            self._idle.set()  # stopping, and the last claim found nothing

    async def _wait(self, wake: trio.Event, due: datetime | None) -> None:
        with trio.move_on_after(self._poll):
            async with trio.open_nursery() as race:

                async def until_woken() -> None:
                    await wake.wait()
                    race.cancel_scope.cancel()

                async def until_due() -> None:
                    assert due is not None
                    await self._clock.sleep_until(due)
                    race.cancel_scope.cancel()

                race.start_soon(until_woken)
                if due is not None:
                    race.start_soon(until_due)

    def _claim(
        self, conn: Conn, *, now: datetime, limit: int, kinds: Sequence[str]
    ) -> tuple[list[Job], datetime | None, dict[str, JobHandler]]:
        """The claim and its peek (:func:`store.jobs.claim_and_peek`), then the checks
        of the claimed kinds that check at claim (:class:`ChecksAtClaim`), in this one
        worker-thread call. Blocking.

        The claim commits on its own (one statement), so a check that fails
        loses nothing: its jobs go to their handler unchecked, which checks them
        itself. Returns the jobs, when the next one is due, and the checked
        handlers by kind.
        """
        jobs, due = queue.claim_and_peek(
            conn,
            now=now,
            limit=limit,
            lease=self._config.lease,
            kinds=kinds,
            node_id=self._node_id,
        )
        instrument = self._instrument
        if instrument is not None and jobs:
            instrument.jobs_claimed([job.args for job in jobs])
        checked: dict[str, JobHandler] = {}
        for kind in self._check_at_claim.keys() & {job.kind for job in jobs}:
            handler = self._check_at_claim[kind]
            group = [job for job in jobs if job.kind == kind]
            try:
                checked[kind] = handler.checked(handler.check(conn, group, now))
                if instrument is not None:
                    instrument.jobs_checked([job.args for job in group])
            except Exception as exc:  # the handler's own check runs again, and reports
                log.warning(
                    "checking claimed jobs failed; their handler checks them",
                    extra={"kind": kind, "error_type": error_type(exc)},
                )
        return jobs, due, checked

    def _dispatch(
        self, work: trio.Nursery, jobs: list[Job], checked: Mapping[str, JobHandler]
    ) -> None:
        by_kind: dict[str, list[Job]] = {}
        for job in jobs:
            self._in_flight[job.fence] = job
            by_kind.setdefault(job.kind, []).append(job)
        self._running += len(jobs)
        if self._instrument is not None:
            self._instrument.jobs_dispatched([job.args for job in jobs])
        for kind, group in by_kind.items():
            work.start_soon(self._run_group, checked.get(kind) or self._handlers[kind], group)

    async def _run_group(self, handler: JobHandler, jobs: list[Job]) -> None:
        reported: set[int] = set()

        async def report(job: Job, result: JobResult) -> None:
            if job.id in reported:
                return
            reported.add(job.id)
            # Noted before anything awaits: from here on a stop records this result
            # rather than giving the job back, even while the send below waits.
            self._reported[job.fence] = (job, result)
            await self._results_send.send((job, result))
            # Handed to the completer: the slot is free for the next claim, while the
            # job stays in _in_flight (renewed) until recorded.
            self._running -= 1
            self._freed.set()

        try:
            await handler.run_batch(jobs, report)
        except StoreUnavailable:
            # Not the jobs' fault: they run again once the database is back, uncounted.
            log.warning("job handler lost the database", extra={"kind": handler.kind})
            for job in jobs:
                await report(job, Defer(timedelta(seconds=self._poll), "database_unavailable"))
        except Exception as exc:
            # The type only: a message or a traceback may quote IDs from the job's args.
            log.error(
                "job handler failed", extra={"kind": handler.kind, "error_type": error_type(exc)}
            )
            for job in jobs:
                await report(job, retry_or_fail(job, f"handler_error:{type(exc).__name__}"))
        for job in jobs:
            if job.id not in reported:
                log.error("job handler did not report a job", extra={"kind": handler.kind})
                await report(job, retry_or_fail(job, "not_reported"))

    async def _complete_loop(self) -> None:
        recv = self._results_recv
        async for first in recv:
            batch = [first]
            while len(batch) < _COMPLETE_BATCH:
                try:
                    batch.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
            if 1 < len(batch) < _COMPLETE_BATCH:
                # Busy: results queue up faster than they are recorded. Gather more so
                # one transaction (and one worker-thread hop) records many of them.
                with trio.move_on_after(_RECORD_LINGER):
                    while len(batch) < _COMPLETE_BATCH:
                        batch.append(await recv.receive())
            await self._record(batch)

    async def _record(self, batch: list[tuple[Job, JobResult]]) -> None:
        try:
            held = await self._apply(batch)
        except StoreUnavailable:
            raise
        except Exception as exc:
            # One result cannot be recorded (its effect raised, or a write it needs
            # failed). Record the others as they are, one transaction each, so one bad
            # effect never holds up or loses the rest.
            log.error(
                "recording a batch of job results failed; recording them one by one",
                extra={"error_type": error_type(exc), "results": len(batch)},
            )
            held = set()
            recorded = []
            for item in batch:
                alone, result = await self._record_alone(item)
                held |= alone
                recorded.append((item[0], result))
            batch = recorded
        lost = 0
        self._records += 1
        self._recorded += len(batch)
        for job, result in batch:
            self._in_flight.pop(job.fence, None)
            self._reported.pop(job.fence, None)
            self._lost.discard(job.fence)
            if job.fence not in held:
                lost += 1
                label = "lost_lease"
            elif isinstance(result, Done):
                label = result.result
            else:
                label = type(result).__name__.lower()
            self._finished(job.kind, label).inc()
        if lost:
            self.lost_leases += lost
            log.warning(
                "job results came after their lease was lost; another claim holds the jobs",
                extra={"jobs": lost},
            )
        if self._stopping and not self._in_flight:
            self._idle.set()

    async def _apply(self, batch: list[tuple[Job, JobResult]]) -> set[Fence]:
        """Record ``batch`` in one transaction; retry while the database is unreachable.

        A write whose connection broke or did not answer (``StoreUnavailable``,
        ``StoreTimeout``) may or may not have committed. It is written again on a
        fresh connection (the pool and the direct connection reconnect through the
        URL: after a failover, to the new primary), with the same ``now``, for as
        long as the fences may hold: the renewal keeps the leases meanwhile, and
        the retries end when the write succeeds or every fence of the batch is
        lost (a renewal found another claim). A fence that held when the write
        landed is the proof that nobody else took the job, so a result recorded
        late is recorded once and its job is not rescued.

        After such a retry, the results that the earlier attempt did commit (the
        row shows this claim finished at ``now``) count as recorded, not as
        lost; their effects were applied by that commit.

        Returns the fences recorded by this runner.
        """
        retries = RECORD_RETRY.retries()
        # One statement (say, gateway hints all done) commits on its own: no BEGIN/COMMIT,
        # and when it only completes jobs, no worker thread either.
        single = records_in_one_statement(batch)
        completes = single and isinstance(batch[0][1], Done)
        fences = [job.fence for job, _ in batch]
        now = self._clock.now()  # the same on every attempt: it marks an earlier commit
        unknown = False
        while True:
            if self._lost.issuperset(fences):
                return set()
            try:
                held: set[Fence]
                if completes:
                    done = await self._complete_direct(batch, now)
                    if done is None:
                        # Abandoned at a stop's bound: it may have committed.
                        unknown = True
                        continue
                    held = done
                else:
                    held = await self._db.run(
                        partial(_apply_results, batch=batch, now=now), transaction=not single
                    )
            except (StoreUnavailable, StoreContention) as exc:
                unknown = unknown or isinstance(exc, StoreUnavailable)
                log.warning("recording job results failed; retrying")
                await trio.sleep(retries.failed())
                continue
            if unknown and len(held) < len(fences):
                held |= await self._recorded_before(batch, held, now)
            return held

    async def _recorded_before(
        self, batch: list[tuple[Job, JobResult]], held: set[Fence], now: datetime
    ) -> set[Fence]:
        """Of the finishing results (:class:`Done`, :class:`Fail`) in ``batch`` not
        in ``held``, those an earlier attempt of this recording committed (asked
        :data:`CHECK_ATTEMPTS` times at most; empty when the database cannot say:
        they then count as lost)."""
        finishing = [
            job.fence
            for job, result in batch
            if job.fence not in held and isinstance(result, Done | Fail)
        ]
        if not finishing:
            return set()
        # Right after a failover the pool may still hold connections the failover broke,
        # and while the database counts as unreachable only one caller a second tries
        # it (Database.run): ask for a few seconds (RECORD_RETRY: 50 ms doubling, about
        # 6 s in all) before counting these results as lost.
        retries = RECORD_RETRY.retries()
        for _ in range(CHECK_ATTEMPTS):
            try:
                return await self._db.run(
                    partial(queue.finished_at, fences=finishing, at=now), transaction=False
                )
            except StoreUnavailable:
                await trio.sleep(retries.failed())
            except StoreError:
                break
        return set()

    async def _complete_direct(
        self, batch: list[tuple[Job, JobResult]], now: datetime
    ) -> set[Fence] | None:
        """Complete ``batch`` on the direct connection, shielded: a statement once sent
        is not abandoned when the runner is cancelled (as a worker thread's is not),
        so a stop knows whether it was recorded. Only a stop bounds it (``_record_by``);
        past the bound the statement is abandoned and ``None`` returned, its outcome
        unknown: the stop's cleanup records the batch again (fenced, so at most once).
        """
        with trio.CancelScope(shield=True, deadline=self._record_by) as recording:
            self._recording = recording
            try:
                return await queue.complete_direct(self._db, [job.fence for job, _ in batch], now)
            finally:
                self._recording = None
        # Out of time at a stop: the stop's own cancellation ends the completer here.
        await trio.lowlevel.checkpoint()
        return None

    async def _record_alone(self, item: tuple[Job, JobResult]) -> tuple[set[Fence], JobResult]:
        """Record one result; when that fails, record it as :class:`Fail` without its
        effect. Returns the fences that held and the result recorded."""
        job = item[0]
        try:
            return await self._apply([item]), item[1]
        except StoreUnavailable:
            raise
        except Exception as exc:
            log.error(
                "a job result's effect failed; the job is recorded as failed without it",
                extra={"kind": job.kind, "error_type": error_type(exc)},
            )
            failed = Fail(f"effect_error:{type(exc).__name__}")
            try:
                return await self._apply([(job, failed)]), failed
            except StoreUnavailable:
                raise
            except Exception as again:
                log.error(
                    "a job result could not be recorded; its lease will run out",
                    extra={"kind": job.kind, "error_type": error_type(again)},
                )
                return set(), failed

    async def _listen_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        """``LISTEN bothy_jobs`` (:class:`~bothy_notify.store.listen.Listener`): each
        notification wakes the claim loop. Started once listening; the claim loop
        polls meanwhile, so nothing waits on a reconnection."""
        await self._jobs_listener.run(delivering(self._notified), task_status=task_status)

    def _notified(self, _notifications: list[Notification]) -> None:
        self._wake.set()

    async def _catch_up(self, _listening: Listening) -> None:
        """What a (re)connection may have missed: a job that became due meanwhile.
        The claim loop claims now and peeks at the next due time."""
        self._wake.set()

    async def _renew_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Extend the lease of running jobs so a slow send is not run twice.

        A job whose result is recorded while its renewal runs is not renewed
        either (it is no longer ``running``), so one missed renewal proves
        nothing: a job counts as lost when a renewal missed it, it is still
        running here, and the next renewal misses it again. Its recording then
        stops retrying (:meth:`_apply`).

        A renewal that fails (the database cannot be reached, or did not answer
        within its bound) is tried again after :data:`RENEW_RETRY`'s backoff,
        not a period later: the jobs being recorded meanwhile keep their leases
        through a failover, on whichever server takes writes next.
        """
        task_status.started()
        period = max(0.5, self._config.lease.total_seconds() / 3)
        retries = RENEW_RETRY.retries()
        wait = period
        missed: set[Fence] = set()
        while True:
            await trio.sleep(wait)
            wait = period
            fences = list(self._in_flight)
            if not fences:
                missed = set()
                continue
            until = self._clock.now() + self._config.lease
            try:
                held = await self._db.run(partial(queue.renew, fences=fences, until=until))
            except StoreError:
                log.warning("renewing job leases failed; trying again soon")
                wait = min(period, retries.failed())
                continue
            retries.succeeded()
            lost, missed = lost_leases(fences, held, missed, self._in_flight)
            if lost:
                self._lost |= lost
                # Their results will be dropped by the fence when they arrive.
                log.warning(
                    "jobs lost their lease while running; another claim holds them",
                    extra={"jobs": len(lost)},
                )


def lost_leases(
    sent: Sequence[Fence],
    held: set[Fence],
    missed_before: set[Fence],
    running: Collection[Fence],
) -> tuple[set[Fence], set[Fence]]:
    """Which jobs lost their lease, after a renewal of ``sent`` held ``held``.

    ``missed_before`` are the jobs the previous renewal missed, ``running`` the
    jobs still running here now. A job the renewal missed may simply have been
    recorded meanwhile (its row is no longer ``running``, so the renewal cannot
    match it); it is lost only when it is still running and the previous
    renewal missed it too. Returns (lost, missed by this renewal and still
    running: the next call's ``missed_before``).
    """
    missed = {f for f in sent if f not in held and f in running}
    return missed & missed_before, missed


def records_in_one_statement(batch: Sequence[tuple[Job, JobResult]]) -> bool:
    """Whether :func:`_apply_results` records ``batch`` in a single statement: its
    results are all of one kind and carry no effect."""
    return len({type(result) for _, result in batch}) == 1 and all(
        isinstance(result, Defer) or result.effect is None for _, result in batch
    )


def _apply_results(conn: Conn, *, batch: list[tuple[Job, JobResult]], now: datetime) -> set[Fence]:
    """Record ``batch`` (fenced) and apply the effects of the results whose fence held,
    in the caller's transaction. Returns the fences that held."""
    done: list[Fence] = []
    failed: list[tuple[Fence, str]] = []
    retries: list[tuple[Fence, datetime, str]] = []
    deferred: list[tuple[Fence, datetime]] = []
    for job, result in batch:
        if isinstance(result, Defer):
            deferred.append((job.fence, now + result.after))
        elif isinstance(result, Done):
            done.append(job.fence)
        elif isinstance(result, Retry):
            retries.append((job.fence, now + result.after, result.error))
        else:
            failed.append((job.fence, result.error))
    held = queue.complete(conn, done, now)
    held |= queue.fail(conn, failed, now)
    held |= queue.retry(conn, retries)
    held |= queue.defer(conn, deferred)
    batched: dict[Callable[[Conn, list[Any], datetime], None], list[Any]] = {}
    for job, result in batch:
        if isinstance(result, Defer) or result.effect is None or job.fence not in held:
            continue
        if isinstance(result.effect, BatchedEffect):
            batched.setdefault(result.effect.apply, []).append(result.effect.item)
        else:
            result.effect(conn, now)
    for apply, items in batched.items():
        apply(conn, items, now)
    return held
