"""The job queue and runner: batches, leases, unique jobs, retries, pruning, crashes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

import trio

from bothy_notify.config import Config, JobsConfig
from bothy_notify.housekeeping import sweep
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.runner import (
    BatchedEffect,
    Defer,
    Done,
    Fail,
    JobResult,
    JobRunner,
    Report,
    Retry,
    backoff,
    records_in_one_statement,
)
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import Job, JobSpec


class Recorder:
    """A handler that answers each job with the next scripted result."""

    def __init__(self, kind: str = "test.work", script: Sequence[JobResult] = ()) -> None:
        self.kind = kind
        self.script = list(script)
        self.seen: list[tuple[int, int]] = []
        self.changed = trio.Event()

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            self.seen.append((job.id, job.attempt))
            result = self.script.pop(0) if self.script else Done()
            await report(job, result)
        changed, self.changed = self.changed, trio.Event()
        changed.set()


async def insert(db: Database, clock: FakeClock, *specs: JobSpec) -> int:
    return await db.run(lambda c: queue.insert(c, list(specs), clock.now()))


async def states(db: Database) -> list[tuple[int, str, int]]:
    return await db.run(
        lambda c: c.execute("SELECT id, state, attempt FROM bothy.jobs ORDER BY id").fetchall()
    )


async def start_runner(
    nursery: trio.Nursery,
    db: Database,
    url: str,
    clock: FakeClock,
    *handlers: object,
    **config: object,
) -> JobRunner:
    runner = JobRunner(
        db=db,
        database_url=url,
        clock=clock,
        handlers=list(handlers),  # type: ignore[arg-type]
        config=JobsConfig(**config),  # type: ignore[arg-type]
        poll_interval=timedelta(milliseconds=50),
        metrics=Metrics(),
    )
    await nursery.start(runner.run)
    return runner


async def until_states(db: Database, predicate: object) -> list[tuple[int, str, int]]:
    with trio.fail_after(10):
        while True:
            rows = await states(db)
            if predicate(rows):  # type: ignore[operator]
                return rows
            await trio.sleep(0.01)


def spec(clock: FakeClock, delay: float = 0, key: str | None = None, attempts: int = 3) -> JobSpec:
    return JobSpec("test.work", {"n": 1}, clock.now() + timedelta(seconds=delay), attempts, key)


async def test_a_due_job_runs_once_and_completes(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    handler = Recorder()
    await start_runner(nursery, db, database_url, clock, handler)
    await insert(db, clock, spec(clock))
    rows = await until_states(db, lambda r: r and r[0][1] == "completed")
    assert rows == [(rows[0][0], "completed", 1)]
    assert len(handler.seen) == 1


async def test_a_scheduled_job_waits_for_the_clock(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    handler = Recorder()
    await start_runner(nursery, db, database_url, clock, handler)
    await insert(db, clock, spec(clock, delay=120))
    await trio.sleep(0.2)  # real time passes; the fake clock does not
    assert handler.seen == []
    clock.advance(120)
    await until_states(db, lambda r: r[0][1] == "completed")


async def test_unique_jobs_are_inserted_once(db: Database, clock: FakeClock) -> None:
    assert await insert(db, clock, spec(clock, key="k1"), spec(clock, key="k1")) == 1
    assert await insert(db, clock, spec(clock, key="k1")) == 0
    assert len(await states(db)) == 1


async def test_concurrent_claims_never_share_a_job(db: Database, clock: FakeClock) -> None:
    await insert(db, clock, *[spec(clock) for _ in range(50)])
    claimed: list[int] = []

    async def claim() -> None:
        jobs = await db.run(
            partial(
                queue.claim,
                now=clock.now(),
                limit=30,
                lease=timedelta(seconds=30),
                kinds=["test.work"],
            )
        )
        claimed.extend(j.id for j in jobs)

    async with trio.open_nursery() as n:
        n.start_soon(claim)
        n.start_soon(claim)
    assert len(claimed) == 50 and len(set(claimed)) == 50


async def test_retry_waits_its_delay_then_fails_after_max_attempts(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    handler = Recorder(script=[Retry(timedelta(seconds=10), "try again")] * 3)
    await start_runner(nursery, db, database_url, clock, handler)
    await insert(db, clock, spec(clock, attempts=2))
    await until_states(db, lambda r: r[0][1] == "available" and r[0][2] == 1)
    clock.advance(9)
    await trio.sleep(0.1)
    assert len(handler.seen) == 1
    clock.advance(1)
    await until_states(db, lambda r: r[0][2] == 2 and r[0][1] == "available")
    # the handler's third answer arrives on the last attempt: the runner records it as is
    assert [a for _id, a in handler.seen] == [1, 2]


async def test_fail_keeps_the_job_as_failed_with_its_error(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    await start_runner(nursery, db, database_url, clock, Recorder(script=[Fail("broken")]))
    await insert(db, clock, spec(clock))
    await until_states(db, lambda r: r[0][1] == "failed")
    error = await db.run(lambda c: c.execute("SELECT last_error FROM bothy.jobs").fetchone())
    assert error == ("broken",)


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    for attempt in range(1, 8):
        delay = backoff(attempt).total_seconds()
        assert 0.5 * 2 ** (attempt - 1) <= delay <= 2 ** (attempt - 1)
    assert backoff(40) <= timedelta(minutes=10)


async def test_finished_jobs_are_pruned_after_the_retention(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    await start_runner(nursery, db, database_url, clock, Recorder())
    await insert(db, clock, spec(clock))
    await until_states(db, lambda r: r[0][1] == "completed")
    config = Config()
    clock.advance(config.jobs.retention - timedelta(seconds=1))
    assert (await db.run(lambda c: sweep(c, clock.now(), config))).jobs_pruned == 0
    clock.advance(2)
    assert (await db.run(lambda c: sweep(c, clock.now(), config))).jobs_pruned == 1
    assert await states(db) == []


async def test_a_killed_runners_job_runs_again(
    nursery: trio.Nursery, db: Database, database_url: str
) -> None:
    clock = FakeClock()
    await db.run(
        lambda c: queue.insert(c, [JobSpec("test.block", {"n": 1}, clock.now(), 3)], clock.now())
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.support.blocking_worker", database_url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = await trio.to_thread.run_sync(worker.stdout.readline)  # type: ignore[union-attr]
        assert line.startswith("started ")
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()  # type: ignore[union-attr]
    assert (await states(db))[0][1] == "running"

    # Another node, once the dead runner's lease has run out, runs it again.
    clock.set(datetime.now(UTC) + timedelta(hours=2))
    rescued = await db.run(lambda c: queue.rescue_expired(c, clock.now()))
    assert rescued == (1, 0)
    handler = Recorder(kind="test.block")
    await start_runner(nursery, db, database_url, clock, handler)
    await until_states(db, lambda r: r[0][1] == "completed")
    assert [attempt for _id, attempt in handler.seen] == [2]


async def test_shutdown_gives_back_a_job_that_did_not_finish(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    class Stuck:
        kind = "test.work"
        started = trio.Event()

        async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
            self.started.set()
            await trio.sleep_forever()

    stuck = Stuck()
    await insert(db, clock, spec(clock))
    async with trio.open_nursery() as n:
        runner = await start_runner(n, db, database_url, clock, stuck)
        await stuck.started.wait()
        runner.stop_claiming()
        with trio.move_on_after(0.2):
            await runner.wait_idle()
        n.cancel_scope.cancel()
    assert [(s, a) for _id, s, a in await states(db)] == [("available", 0)]


class CheckedAtClaim:
    """A handler whose check runs in the claim's worker-thread call (``ChecksAtClaim``):
    it reads each job's row on the claim's connection; ``fail`` makes the check raise."""

    kind = "test.work"

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.checks: list[list[int]] = []
        self.ran: list[tuple[str, int, object]] = []

    def check(self, conn: object, jobs: Sequence[Job], now: datetime) -> dict[int, str]:
        self.checks.append([job.id for job in jobs])
        if self.fail:
            raise RuntimeError("check failed")
        rows = conn.execute(  # type: ignore[attr-defined]
            "SELECT id, state FROM bothy.jobs WHERE id = ANY(%s)", ([job.id for job in jobs],)
        ).fetchall()
        return {int(i): str(state) for i, state in rows}

    def checked(self, verdicts: dict[int, str]) -> CheckedRun:
        return CheckedRun(self, verdicts)

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            self.ran.append(("unchecked", job.id, None))
            await report(job, Done())


class CheckedRun:
    def __init__(self, parent: CheckedAtClaim, verdicts: dict[int, str]) -> None:
        self.kind = parent.kind
        self.parent, self.verdicts = parent, verdicts

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            self.parent.ran.append(("checked", job.id, self.verdicts.get(job.id)))
            await report(job, Done())


async def test_a_handler_that_checks_at_claim_gets_its_batch_checked_by_the_claim(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    handler = CheckedAtClaim()
    await insert(db, clock, spec(clock), spec(clock))
    await start_runner(nursery, db, database_url, clock, handler)
    rows = await until_states(db, lambda r: len(r) == 2 and all(s == "completed" for _, s, _ in r))

    ids = sorted(i for i, _, _ in rows)
    assert sorted(i for batch in handler.checks for i in batch) == ids  # each checked once
    # The check ran after the claim committed: it saw the jobs running.
    assert sorted(handler.ran) == [("checked", i, "running") for i in ids]


async def test_a_check_at_claim_that_fails_leaves_the_jobs_to_their_handler(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    handler = CheckedAtClaim(fail=True)
    await insert(db, clock, spec(clock))
    await start_runner(nursery, db, database_url, clock, handler)
    rows = await until_states(db, lambda r: r and r[0][1] == "completed")

    assert rows == [(rows[0][0], "completed", 1)]
    assert handler.ran == [("unchecked", rows[0][0], None)]  # nothing lost, run once


def test_results_of_one_kind_without_effects_are_recorded_in_one_statement() -> None:
    job = Job(
        id=1,
        kind="k",
        args={},
        attempt=1,
        max_attempts=3,
        scheduled_at=datetime(2026, 1, 1, tzinfo=UTC),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        claim=1,
    )
    effect = BatchedEffect(apply=lambda conn, items, now: None, item=1)
    later = timedelta(seconds=1)
    assert records_in_one_statement([(job, Done(Result.PUBLISHED)), (job, Done())])
    assert records_in_one_statement([(job, Defer(later, "busy"))])
    assert not records_in_one_statement([(job, Done()), (job, Fail("x"))])
    assert not records_in_one_statement([(job, Done(effect=effect))])
    assert not records_in_one_statement([(job, Retry(later, "x", effect=lambda c, n: None))])
