"""Fencing: a job result applies only to the run that claimed the job.

A runner whose lease ran out (on the fake clock) while another runner claimed
the job again can no longer complete, fail, retry, defer, renew or release it,
and the effects of its results (a registration's token lifecycle) are not
applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import trio

from bothy_notify.config import JobsConfig
from bothy_notify.housekeeping import Housekeeper
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.runner import (
    BatchedEffect,
    Defer,
    Done,
    Effect,
    Fail,
    JobResult,
    JobRunner,
    Report,
    Retry,
    _apply_results,
)
from bothy_notify.store import jobs as queue
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job, JobSpec
from tests.harness import make_config, wait_for

KIND = "test.fenced"
LEASE = timedelta(seconds=30)


class Gated:
    """Holds each batch until ``release`` is set, then reports ``result`` for each job."""

    kind = KIND

    def __init__(self, result: JobResult) -> None:
        self.result = result
        self.entered = trio.Event()
        self.release = trio.Event()
        self.claims: list[int] = []

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        self.claims.extend(j.claim for j in jobs)
        self.entered.set()
        await self.release.wait()
        for job in jobs:
            await report(job, self.result)


def runner(db: Database, url: str, clock: FakeClock, handler: Any, metrics: Metrics) -> JobRunner:
    return JobRunner(
        db=db,
        database_url=url,
        clock=clock,
        handlers=[handler],
        config=JobsConfig(concurrency=1, lease=LEASE),
        poll_interval=timedelta(milliseconds=50),
        metrics=metrics,
    )


def register(url: str) -> str:
    with psycopg.connect(url) as conn:
        registered = regs.upsert(
            conn,
            user_id="alex",
            device_id="phone",
            provider="fake",
            token="tok",
            environment=None,
            app_id=None,
            signing_key=None,
            now=datetime.now(UTC),
        )
    return registered.registration.id


def job_row(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state, attempt, claim, last_error FROM bothy.jobs").fetchone()
    assert row is not None
    return tuple(row)


def invalidated(url: str, registration_id: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT invalidated_at FROM bothy.push_registrations WHERE id = %s",
            (registration_id,),
        ).fetchone()
    assert row is not None
    return row[0] is not None


def mark_dead_effect(registration_id: str) -> Effect:
    def effect(conn: Conn, now: datetime) -> None:
        regs.mark_dead(conn, registration_id, "dead", now)

    return effect


async def lose_the_lease(db: Database, clock: FakeClock) -> None:
    """The lease runs out on the fake clock and the housekeeper makes the job available."""
    clock.advance(LEASE + timedelta(seconds=1))
    assert await db.run(lambda c: queue.rescue_expired(c, clock.now())) == (1, 0)


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param("done", id="complete"),
        pytest.param("retry", id="retry"),
        pytest.param("fail", id="fail"),
        pytest.param("defer", id="defer"),
    ],
)
async def test_a_runner_that_lost_its_lease_cannot_touch_a_job_another_runner_claimed(
    db: Database, database_url: str, clock: FakeClock, stale: str
) -> None:
    registration = register(database_url)
    effect = mark_dead_effect(registration)
    results: dict[str, JobResult] = {
        "done": Done(Result.DEAD, effect),
        "retry": Retry(timedelta(seconds=5), "transient", effect),
        "fail": Fail("broken", effect),
        "defer": Defer(timedelta(seconds=5), "busy"),
    }
    stale_result = results[stale]
    first, second = Gated(stale_result), Gated(Done(Result.DELIVERED))
    first_metrics = Metrics()
    await db.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, clock.now(), 5)], clock.now()))
    async with trio.open_nursery() as nursery:
        a = runner(db, database_url, clock, first, first_metrics)
        await nursery.start(a.run)
        await first.entered.wait()
        await lose_the_lease(db, clock)

        b = runner(db, database_url, clock, second, Metrics())
        await nursery.start(b.run)
        await second.entered.wait()
        assert (first.claims, second.claims) == ([1], [2])

        # The first runner answers while the second one holds the job.
        first.release.set()
        await wait_for(lambda: _true(a.lost_leases == 1), what="the stale result")
        assert job_row(database_url) == ("running", 2, 2, "lease expired")
        assert not invalidated(database_url, registration)
        rendered = first_metrics.render().decode()
        assert f'bothy_jobs_finished_total{{kind="{KIND}",result="lost_lease"}} 1.0' in rendered

        second.release.set()
        await wait_for(
            lambda: trio.to_thread.run_sync(lambda: job_row(database_url)[0] == "completed"),
            what="the second runner's result",
        )
        nursery.cancel_scope.cancel()
    assert not invalidated(database_url, registration)


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


async def test_renew_and_release_with_a_lost_claim_change_nothing(
    db: Database, clock: FakeClock
) -> None:
    await db.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, clock.now(), 5)], clock.now()))

    def claim(c: Conn) -> list[Job]:
        return queue.claim(c, now=clock.now(), limit=1, lease=LEASE, kinds=[KIND])

    [lost] = await db.run(claim)
    await lose_the_lease(db, clock)
    [current] = await db.run(claim)
    later = clock.now() + timedelta(hours=1)
    assert await db.run(lambda c: queue.renew(c, [lost.fence], later)) == set()
    assert await db.run(lambda c: queue.release(c, [lost.fence])) == set()
    row = await db.run(
        lambda c: c.execute("SELECT state, claim, lease_until FROM bothy.jobs").fetchone()
    )
    assert row == ("running", current.claim, clock.now() + LEASE)
    assert await db.run(lambda c: queue.renew(c, [current.fence], later)) == {current.fence}


async def test_the_housekeeper_counts_the_jobs_it_rescues(db: Database, clock: FakeClock) -> None:
    """A job whose runner lost the database after sending runs again: counted, so the
    sends a failover may repeat show in ``bothy_jobs_rescued_total``."""
    metrics = Metrics()
    keeper = Housekeeper(db=db, clock=clock, config=make_config(), metrics=metrics)
    await db.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, clock.now(), 5)], clock.now()))
    await db.run(lambda c: queue.claim(c, now=clock.now(), limit=1, lease=LEASE, kinds=[KIND]))

    await keeper.tick()
    clock.advance(LEASE + timedelta(seconds=1))
    await keeper.tick()

    rescued = metrics.registry.get_sample_value
    assert rescued("bothy_jobs_rescued_total", {"outcome": "again"}) == 1
    assert rescued("bothy_jobs_rescued_total", {"outcome": "failed"}) == 0


async def test_only_the_effects_of_results_whose_fence_held_are_applied(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    first, second = register(database_url), _second_registration(database_url)
    specs = [JobSpec(KIND, {"n": n}, clock.now(), 5) for n in (1, 2)]
    await db.run(lambda c: queue.insert(c, specs, clock.now()))

    def claim(c: Conn) -> list[Job]:
        return queue.claim(c, now=clock.now(), limit=2, lease=LEASE, kinds=[KIND])

    lost, held = await db.run(claim)
    await db.run(
        lambda c: c.execute("UPDATE bothy.jobs SET claim = claim + 1 WHERE id = %s", (lost.id,))
    )
    batch: list[tuple[Job, JobResult]] = [
        (lost, Done(Result.DEAD, BatchedEffect(_mark_dead_many, first))),
        (held, Done(Result.DEAD, BatchedEffect(_mark_dead_many, second))),
    ]
    applied = await db.run(lambda c: _apply_results(c, batch=batch, now=clock.now()))
    assert applied == {held.fence}
    assert (invalidated(database_url, first), invalidated(database_url, second)) == (False, True)


def _mark_dead_many(conn: Conn, ids: list[str], now: datetime) -> None:
    for registration_id in ids:
        regs.mark_dead(conn, registration_id, "dead", now)


def _second_registration(url: str) -> str:
    with psycopg.connect(url) as conn:
        registered = regs.upsert(
            conn,
            user_id="kim",
            device_id="tablet",
            provider="fake",
            token="tok-2",
            environment=None,
            app_id=None,
            signing_key=None,
            now=datetime.now(UTC),
        )
    return registered.registration.id


async def test_an_effect_that_raises_fails_its_job_and_the_runner_goes_on(
    db: Database, database_url: str, clock: FakeClock
) -> None:
    registration = register(database_url)

    def broken(conn: Conn, now: datetime) -> None:
        raise KeyError("a bug in an effect")

    class TwoResults:
        kind = KIND

        async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
            for job in jobs:
                effect = broken if job.args["n"] == 1 else mark_dead_effect(registration)
                await report(job, Done(Result.DEAD, effect))

    specs = [JobSpec(KIND, {"n": n}, clock.now(), 5) for n in (1, 2)]
    await db.run(lambda c: queue.insert(c, specs, clock.now()))
    async with trio.open_nursery() as nursery:
        r = JobRunner(
            db=db,
            database_url=database_url,
            clock=clock,
            handlers=[TwoResults()],
            config=JobsConfig(lease=LEASE),
            poll_interval=timedelta(milliseconds=50),
            metrics=Metrics(),
        )
        await nursery.start(r.run)

        async def finished() -> bool:
            rows = await db.run(
                lambda c: c.execute(
                    "SELECT args->>'n', state, last_error FROM bothy.jobs ORDER BY 1"
                ).fetchall()
            )
            return all(state not in {"running", "available"} for _n, state, _e in rows)

        await wait_for(finished, what="both results")
        assert r.running
        nursery.cancel_scope.cancel()
    rows = await db.run(
        lambda c: c.execute(
            "SELECT args->>'n', state, last_error FROM bothy.jobs ORDER BY 1"
        ).fetchall()
    )
    assert rows == [("1", "failed", "effect_error:KeyError"), ("2", "completed", None)]
    assert invalidated(database_url, registration)
