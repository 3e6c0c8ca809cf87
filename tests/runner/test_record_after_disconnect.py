"""A job result whose recording lost its connection is recorded once, on a fresh
connection, and its job is not run again.

A failover breaks the connection a runner was recording on: the write may have
committed on the old primary (and, replicated synchronously, be on the new one)
or not. The runner here reaches the session's embedded server through a proxy
(:mod:`tests.support.cutting`) that cuts the recording's connection once, before
or after the server took the write; the server stays up, so the runner's next
connection reaches it as one after a failover reaches the new primary. Whether
the first write landed or not, the job ends completed under its one claim, its
effect applied once, counted as delivered (not as a lost lease), and a
housekeeper sweep past the lease finds nothing to rescue. A recording that
cannot land keeps retrying while its lease is renewed, and stops once the
renewal finds the fence lost to another claim.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import psycopg
import pytest
import trio

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.runner import Done, JobHandler, JobRunner, Report
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job, JobSpec
from tests.harness import wait_for
from tests.support.cutting import Cut, CuttingProxy

KIND = "test.recorded"
LEASE = timedelta(seconds=30)


class SendsOnce:
    """Reports ``result`` for each job it is given; counts the runs (a "send")."""

    kind = KIND

    def __init__(self, result: Done) -> None:
        self.result = result
        self.claims: list[int] = []

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            self.claims.append(job.claim)
            await report(job, self.result)


def count_effect(conn: Conn, _now: object) -> None:
    conn.execute("INSERT INTO effect_runs DEFAULT VALUES")


def query(url: str, sql: str) -> tuple[object, ...]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return tuple(row)


def make_runner(
    db: Database,
    url: str,
    clock: FakeClock,
    handler: JobHandler,
    lease: timedelta,
    metrics: Metrics,
) -> JobRunner:
    return JobRunner(
        db=db,
        database_url=url,  # the LISTEN connection goes straight to the server
        clock=clock,
        handlers=[handler],
        config=JobsConfig(concurrency=4, lease=lease),
        poll_interval=timedelta(milliseconds=50),
        metrics=metrics,
    )


@pytest.fixture
async def proxy(nursery: trio.Nursery, database_url: str) -> CuttingProxy:
    cutter = CuttingProxy(database_url)
    await nursery.start(cutter.run)
    return cutter


@pytest.fixture
async def proxied(proxy: CuttingProxy, database_url: str) -> AsyncIterator[Database]:
    """The runner's pool (and its direct connection) through the proxy."""
    database = Database(proxy.url(database_url), pool_size=2, name="jobs")
    await database.open()
    try:
        yield database
    finally:
        await database.close()


@pytest.mark.parametrize(
    ("effect", "after_answer"),
    [
        pytest.param(False, False, id="direct-lost-before-the-server"),
        pytest.param(False, True, id="direct-committed-unheard"),
        pytest.param(True, False, id="pool-lost-before-the-commit"),
        pytest.param(True, True, id="pool-committed-unheard"),
    ],
)
async def test_a_recording_cut_off_is_recorded_once_and_the_job_not_run_again(
    proxy: CuttingProxy,
    proxied: Database,
    database_url: str,
    clock: FakeClock,
    effect: bool,
    after_answer: bool,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE effect_runs (n serial)")
    now = clock.now()
    await proxied.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, now, 5)], now))
    # A completion without an effect is one statement on the direct connection (a
    # bind of its prepared statement); with an effect it is a transaction on the pool.
    proxy.armed = (
        Cut(b"Q", b"COMMIT", after_answer)
        if effect
        else Cut(b"B", b"bothy_complete_jobs", after_answer)
    )
    handler = SendsOnce(Done(Result.DELIVERED, count_effect if effect else None))
    metrics = Metrics()
    runner = make_runner(proxied, database_url, clock, handler, LEASE, metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        # The runner's count, not the row: a write committed unheard shows in the row
        # before the runner has settled it.
        await wait_for(lambda: _true(runner.statistics()["recorded"] == 1), what="the recording")
        nursery.cancel_scope.cancel()

    assert proxy.cuts == 1
    assert handler.claims == [1]
    assert query(database_url, "SELECT state, attempt, claim FROM bothy.jobs") == (
        "completed",
        1,
        1,
    )
    if effect:
        assert query(database_url, "SELECT count(*) FROM effect_runs") == (1,)
    assert runner.lost_leases == 0
    rendered = metrics.render().decode()
    assert f'bothy_jobs_finished_total{{kind="{KIND}",result="delivered"}} 1.0' in rendered
    assert "lost_lease" not in rendered
    # Past the lease, the housekeeper finds nothing to rescue: the job is not run again.
    clock.advance(LEASE + timedelta(seconds=1))
    assert await proxied.run(lambda c: queue.rescue_expired(c, clock.now())) == (0, 0)


async def test_a_recording_that_cannot_land_keeps_the_lease_until_the_fence_is_lost(
    proxy: CuttingProxy, proxied: Database, database_url: str, clock: FakeClock
) -> None:
    lease = timedelta(seconds=1.5)  # a renewal every 0.5 s
    now = clock.now()
    await proxied.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, now, 5)], now))
    # Every completion's connection is cut before it reaches the server; the pool's
    # renewals pass.
    proxy.armed = Cut(b"B", b"bothy_complete_jobs", after_answer=False, times=None)
    handler = SendsOnce(Done(Result.DELIVERED))
    metrics = Metrics()
    runner = make_runner(proxied, database_url, clock, handler, lease, metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await wait_for(lambda: _true(proxy.cuts >= 2), what="the recording retried")

        # The renewal keeps the lease meanwhile (on the fake clock, moved by hand).
        clock.advance(timedelta(seconds=1))
        renewed = f"SELECT lease_until = '{(clock.now() + lease).isoformat()}' FROM bothy.jobs"
        await wait_for(
            lambda: trio.to_thread.run_sync(lambda: query(database_url, renewed) == (True,)),
            what="the lease renewed while the recording retries",
        )
        assert runner.lost_leases == 0

        # The lease runs out, the housekeeper rescues the job and another runner claims
        # it: the renewal finds the fence lost, and the recording gives up.
        clock.advance(lease + timedelta(seconds=1))
        with psycopg.connect(database_url) as conn:  # one transaction: no claim between
            assert queue.rescue_expired(conn, clock.now()) == (1, 0)
            [other] = queue.claim(conn, now=clock.now(), limit=1, lease=LEASE, kinds=[KIND])
        await wait_for(lambda: _true(runner.lost_leases == 1), what="the recording given up")
        nursery.cancel_scope.cancel()

    assert handler.claims == [1]
    assert query(database_url, "SELECT state, claim FROM bothy.jobs") == ("running", other.claim)
    rendered = metrics.render().decode()
    assert f'bothy_jobs_finished_total{{kind="{KIND}",result="lost_lease"}} 1.0' in rendered


async def _true(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return value


class Holds:
    """Holds its jobs until ``release`` is set, then reports them done."""

    kind = KIND

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        self.entered.set()
        await self.release.wait()
        for job in jobs:
            await report(job, Done(Result.DELIVERED))


async def test_a_renewal_that_lost_its_connection_is_tried_again_soon(
    proxy: CuttingProxy, proxied: Database, database_url: str, clock: FakeClock
) -> None:
    lease = timedelta(seconds=15)  # a renewal every 5 s
    now = clock.now()
    await proxied.run(lambda c: queue.insert(c, [JobSpec(KIND, {"n": 1}, now, 5)], now))
    proxy.armed = Cut(b"P", b"SET lease_until", after_answer=False)
    handler = Holds()
    runner = make_runner(proxied, database_url, clock, handler, lease, Metrics())
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        await handler.entered.wait()
        clock.advance(timedelta(seconds=1))
        renewed = f"SELECT lease_until = '{(clock.now() + lease).isoformat()}' FROM bothy.jobs"
        await wait_for(lambda: _true(proxy.cuts == 1), timeout=15, what="the first renewal cut")
        cut_at = trio.current_time()
        # Again within RENEW_RETRY's first waits, not a period (5 s) later.
        await wait_for(
            lambda: trio.to_thread.run_sync(lambda: query(database_url, renewed) == (True,)),
            timeout=3,
            what="the renewal tried again",
        )
        assert trio.current_time() - cut_at < 3
        handler.release.set()
        await wait_for(lambda: _true(runner.statistics()["recorded"] == 1), what="the recording")
        nursery.cancel_scope.cancel()
    assert runner.lost_leases == 0
