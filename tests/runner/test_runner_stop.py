"""A stop (the drain period over) or a runner failure: results reported are recorded,
only jobs that never reported are given back.

The handler stands for a provider that answers when the test says so; the
database holds a job's row locked (as a busy primary or a checkpoint can stall
writes to ``bothy.jobs``), so a recording is still in flight when the runner is
cancelled. Each step waits on a condition, never on time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from operator import contains
from typing import Any

import pytest
import trio
import trio.testing

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.runner import Done, JobRunner, Report
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import Job, JobSpec
from tests.support.stall import RowLock, a_write_waits

KIND = "test.send"


class Answering:
    """Holds each job until the test answers it, then reports it sent."""

    kind = KIND

    def __init__(self) -> None:
        self.held: dict[int, Job] = {}
        """Jobs handed to the handler, by id."""
        self.answers: dict[int, trio.Event] = {}
        self.reported: set[int] = set()
        """Jobs whose report returned (handed to the completer)."""

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        async with trio.open_nursery() as nursery:
            for job in jobs:
                self.held[job.id] = job
                self.answers[job.id] = trio.Event()
                nursery.start_soon(self._one, job, report)

    async def _one(self, job: Job, report: Report) -> None:
        await self.answers[job.id].wait()
        await report(job, Done(Result.DELIVERED))
        self.reported.add(job.id)

    def answer(self, job_id: int) -> None:
        self.answers[job_id].set()


class BreakingClock(FakeClock):
    """A fake clock whose next reading fails once :attr:`broken` is set (a bug in
    the runner's own loop, as an unexpected error from anywhere would be)."""

    broken = False

    def now(self) -> datetime:
        if self.broken:
            self.broken = False
            raise RuntimeError("the clock broke")
        return super().now()


async def until(predicate: Callable[[], Any], what: str) -> None:
    """Poll ``predicate`` (sync or async) until it holds; fail after 10 s."""
    with trio.fail_after(10):
        while True:
            value = predicate()
            if not isinstance(value, bool):
                value = await value
            if value:
                return
            await trio.sleep(0.005)
    raise AssertionError(what)  # pragma: no cover - fail_after raises first


async def insert(db: Database, clock: FakeClock, count: int) -> list[int]:
    specs = [JobSpec(KIND, {"n": n}, clock.now(), 3, None) for n in range(count)]
    await db.run(lambda c: queue.insert(c, specs, clock.now()))
    rows = await db.run(lambda c: c.execute("SELECT id FROM bothy.jobs ORDER BY id").fetchall())
    return [row[0] for row in rows]


async def states(db: Database) -> dict[int, tuple[str, int]]:
    rows = await db.run(
        lambda c: c.execute("SELECT id, state, attempt FROM bothy.jobs ORDER BY id").fetchall()
    )
    return {row[0]: (row[1], row[2]) for row in rows}


async def start_runner(
    nursery: trio.Nursery,
    db: Database,
    url: str,
    clock: FakeClock,
    handler: Answering,
    *,
    concurrency: int = 512,
) -> JobRunner:
    runner = JobRunner(
        db=db,
        database_url=url,
        clock=clock,
        handlers=[handler],
        # A long lease: no renewal writes to the locked row while the test runs.
        config=JobsConfig(concurrency=concurrency, lease=timedelta(minutes=10)),
        poll_interval=timedelta(milliseconds=50),
        metrics=Metrics(),
    )
    await nursery.start(runner.run)
    return runner


async def release_once_stopped(lock: RowLock) -> None:
    """Once the runner has taken its cancellation (every task waits), let the
    database answer again."""
    with trio.CancelScope(shield=True):
        await trio.testing.wait_all_tasks_blocked()
        await lock.release()


async def test_a_result_whose_recording_is_in_flight_at_the_deadline_is_recorded(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    """The provider answered the first job and its recording waits on the database
    when the drain period ends: it is recorded, not given back (a push that went
    out is not sent again). The second job, never answered, is given back."""
    answered, silent = await insert(db, clock, 2)
    handler = Answering()
    async with RowLock(database_url) as lock, trio.open_nursery() as nursery:
        runner = await start_runner(nursery, db, database_url, clock, handler)
        await until(lambda: len(handler.held) == 2, "both jobs claimed")
        await lock.take(answered)
        handler.answer(answered)
        await until(partial(a_write_waits, database_url), "the recording to wait")
        nursery.cancel_scope.cancel()  # the drain period is over
        await release_once_stopped(lock)
    assert await states(db) == {answered: ("completed", 1), silent: ("available", 0)}
    assert runner.lost_leases == 0
    assert runner.statistics()["recorded"] == 1


async def test_results_queued_or_held_by_a_blocked_handler_at_the_deadline_are_recorded(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    """With the recorder stalled, two answers wait in the results channel (as deep as
    ``jobs.concurrency``, here 2) and a third answer's handler waits for room in it
    when the drain period ends: all are recorded, none given back. The job still
    waiting for its provider is given back."""
    ids = await insert(db, clock, 5)
    first, queued_a, queued_b, blocked, silent = ids
    handler = Answering()
    async with RowLock(database_url) as lock, trio.open_nursery() as nursery:
        runner = await start_runner(nursery, db, database_url, clock, handler, concurrency=2)
        await until(lambda: set(handler.held) == {first, queued_a}, "two jobs claimed")
        await lock.take(first)
        handler.answer(first)
        await until(partial(a_write_waits, database_url), "the recording to wait")
        # Each report hands a result to the channel and frees a slot: the next job is
        # claimed. The first answer is the recorder's, the next two fill the channel.
        for job_id, then in ((queued_a, blocked), (queued_b, silent)):
            await until(partial(contains, handler.held, job_id), "the next job claimed")
            handler.answer(job_id)
            await until(partial(contains, handler.reported, job_id), "the result queued")
            await until(partial(contains, handler.held, then), "the next job claimed")
        handler.answer(blocked)
        await trio.testing.wait_all_tasks_blocked()
        assert blocked not in handler.reported  # its handler waits for room
        nursery.cancel_scope.cancel()  # the drain period is over
        await release_once_stopped(lock)
    assert await states(db) == {
        first: ("completed", 1),
        queued_a: ("completed", 1),
        queued_b: ("completed", 1),
        blocked: ("completed", 1),
        silent: ("available", 0),
    }
    assert runner.lost_leases == 0
    assert runner.statistics()["recorded"] == 4


async def test_a_stop_during_a_claim_waits_for_the_jobs_it_claims(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    """A graceful stop that begins while a claim is in flight: the jobs that claim
    takes run and are recorded before the runner says it is idle. (Idle at once
    ended the drain at once, and the stop cancelled their sends as they went out
    and gave the jobs back: seen in the rolling-restart test as a push sent twice.)"""
    (job,) = await insert(db, clock, 1)
    handler = Answering()
    idle = trio.Event()

    async def note_idle(runner: JobRunner) -> None:
        await runner.wait_idle()
        idle.set()

    async with RowLock(database_url) as lock, trio.open_nursery() as nursery:
        await lock.take_table()
        runner = await start_runner(nursery, db, database_url, clock, handler)
        await until(partial(a_write_waits, database_url), "the claim to wait")
        runner.stop_claiming()
        nursery.start_soon(note_idle, runner)
        await lock.release()
        await until(lambda: job in handler.held, "the job claimed and dispatched")
        await trio.testing.wait_all_tasks_blocked()
        assert not idle.is_set()
        handler.answer(job)
        with trio.fail_after(10):
            await idle.wait()
        nursery.cancel_scope.cancel()
    assert await states(db) == {job: ("completed", 1)}
    assert runner.statistics()["recorded"] == 1


async def test_a_runner_failure_records_the_results_reported_and_gives_back_the_rest(
    db: Database, database_url: str
) -> None:
    """The runner fails (its supervisor would start it again) with one result being
    recorded and one queued: both are recorded; the unanswered job is given back."""
    clock = BreakingClock()
    recording, queued, silent = await insert(db, clock, 3)
    handler = Answering()
    with pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="the clock broke"), flatten_subgroups=True
    ):
        async with RowLock(database_url) as lock, trio.open_nursery() as nursery:
            runner = await start_runner(nursery, db, database_url, clock, handler)
            await until(lambda: len(handler.held) == 3, "the jobs claimed")
            await lock.take(recording)
            handler.answer(recording)
            await until(partial(a_write_waits, database_url), "the recording to wait")
            handler.answer(queued)
            await until(lambda: queued in handler.reported, "the result queued")
            clock.broken = True
            runner.nudge()  # the claim loop reads the clock and fails
            with trio.CancelScope(shield=True):  # the failure cancels this block
                # Only the claim loop can read the clock now (the recorder waits on the
                # lock); the lock goes once it has, so the recorder never reads it.
                await until(lambda: not clock.broken, "the claim loop to read the clock")
                await release_once_stopped(lock)
    assert await states(db) == {
        recording: ("completed", 1),
        queued: ("completed", 1),
        silent: ("available", 0),
    }
    assert runner.lost_leases == 0
