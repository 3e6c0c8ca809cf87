"""The runner's second entry: jobs this node claimed itself (``JobRunner.run_claimed``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import trio

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.runner import Done, JobRunner, Report
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import ClaimHere, Job, JobSpec, JobWriter

KIND = "test.local"


class Seen:
    """Reports every job done and remembers which ran, and with which handler."""

    def __init__(self, name: str) -> None:
        self.kind = KIND
        self.name = name
        self.ran: list[tuple[str, int, int]] = []

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            self.ran.append((self.name, job.id, job.claim))
            await report(job, Done(Result.DONE))


def new_runner(db: Database, url: str, clock: FakeClock, handler: Seen) -> JobRunner:
    return JobRunner(
        db=db,
        database_url=url,
        clock=clock,
        handlers=[handler],
        config=JobsConfig(concurrency=8, lease=timedelta(seconds=30)),
        poll_interval=timedelta(milliseconds=50),
        metrics=Metrics(),
    )


async def claim_here(db: Database, clock: FakeClock, *keys: str) -> list[Job]:
    def write(conn: object) -> list[Job]:
        writer = JobWriter(conn, clock.now())  # type: ignore[arg-type]
        writer.claim_here(ClaimHere(frozenset({KIND}), None, timedelta(seconds=30), 10))
        writer.extend(JobSpec(KIND, {"k": k}, clock.now(), 3, unique_key=k) for k in keys)
        writer.finish()
        return writer.claimed

    return await db.run(write)


async def job_states(db: Database) -> list[tuple[str, int]]:
    return await db.run(
        lambda c: c.execute("SELECT state, claim FROM bothy.jobs ORDER BY id").fetchall()
    )


async def test_a_runner_that_is_not_running_takes_no_claimed_jobs(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    runner = new_runner(db, database_url, clock, Seen("kind"))
    jobs = await claim_here(db, clock, "a")
    assert runner.room() == 0
    assert runner.run_claimed(jobs) is False


async def test_claimed_jobs_run_with_the_given_handler_and_are_recorded(
    db: Database, database_url: str, clock: FakeClock, nursery: trio.Nursery
) -> None:
    registered, given = Seen("kind"), Seen("given")
    runner = new_runner(db, database_url, clock, registered)
    await nursery.start(runner.run)
    assert runner.room() == 4 * 8
    jobs = await claim_here(db, clock, "a", "b")

    assert runner.run_claimed(jobs, given) is True
    with trio.fail_after(10):
        while await job_states(db) != [("completed", 1), ("completed", 1)]:
            await trio.sleep(0.01)
    assert sorted(given.ran) == sorted(("given", j.id, 1) for j in jobs)
    assert registered.ran == []  # the claim loop never saw them
    assert runner.lost_leases == 0

    runner.stop_claiming()
    assert runner.room() == 0
    assert runner.run_claimed(await claim_here(db, clock, "c")) is False
