"""The one push handler (``push/jobs.py``) running a kind defined here in a few lines:
what every kind of push gets without writing it (malformed args, counted skips, its
own results, retries and failure, the lifecycle's and the kind's effects, the
delivery latency), against the real database and the fake provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from bothy_notify.config import JobsConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.instrument import Instrument
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.jobs import MALFORMED_ARGS, PushJobHandler, PushKind
from bothy_notify.push.port import Outcome, OutcomeKind, ReadMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import (
    BatchedEffect,
    ChecksAtClaim,
    Done,
    Fail,
    JobResult,
    JobRunner,
    Retry,
)
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job, JobSpec


@dataclass(frozen=True, slots=True)
class Probe:
    target: Target


def _written(conn: Conn, items: list[str], now: datetime) -> None:
    """An effect: the handler hands it to the runner, which applies it."""


class ProbePush(PushKind[str, Probe]):
    """A whole kind of push: args ``{"token"}``; ``gone`` is skipped, ``held`` held."""

    kind = "test.push"
    plan_writes = False

    def __init__(self, *, failing_plans: int = 0) -> None:
        self.plans = 0
        self.failing_plans = failing_plans

    def parse(self, args: Mapping[str, Any]) -> str | None:
        token = args.get("token")
        return token if isinstance(token, str) else None

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, str]], now: datetime
    ) -> dict[int, Probe | SkipReason | Done]:
        self.plans += int(conn.execute("SELECT 1").fetchone()[0])  # type: ignore[index]
        if self.failing_plans:
            self.failing_plans -= 1
            raise RuntimeError("plan failed")
        plans: dict[int, Probe | SkipReason | Done] = {}
        for job, token in claimed:
            if token == "gone":
                plans[job.id] = SkipReason.NO_REGISTRATION
            elif token == "held":
                plans[job.id] = Done(Result.HELD)
            else:
                target = Target(
                    registration_id=f"reg-{job.id}",
                    user_id="sam",
                    provider="fake",
                    token=token,
                    platform="ios",
                    attempt=job.attempt,
                    max_attempts=job.max_attempts,
                )
                plans[job.id] = Probe(target)
        return plans

    def message(self, plan: Probe) -> ReadMessage:
        return ReadMessage(thread_id="t1", seq=1)

    def delivered(self, plan: Probe) -> BatchedEffect:
        return BatchedEffect(_written, ("delivered", plan.target.registration_id))

    def route(self, plan: Probe) -> tuple[str, int]:
        return ("push", 0)


class Answers:
    """A lifecycle that records what it was told and gives an effect per answer."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, OutcomeKind, bool]] = []

    def answered(self, plan: Probe, outcome: Outcome, *, last_attempt: bool) -> BatchedEffect:
        self.seen.append((plan.target.token, outcome.kind, last_attempt))
        return BatchedEffect(_written, ("lifecycle", plan.target.registration_id))


def job(id_: int, args: dict[str, int | str], attempt: int = 1) -> Job:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Job(id_, "test.push", args, attempt, 3, at, at, claim=1)


BATCH: list[tuple[dict[str, int | str], int]] = [
    ({"nothing": 1}, 1),
    ({"token": "gone"}, 1),
    ({"token": "held"}, 1),
    ({"token": "ok"}, 1),
    ({"token": "dead-1"}, 1),
    ({"token": "transient-1"}, 1),
    ({"token": "transient-2"}, 3),
]
"""Every end of a push job: (args, attempt) of jobs 1 to 7."""


def batch() -> list[Job]:
    return [job(i, args, attempt) for i, (args, attempt) in enumerate(BATCH, start=1)]


def make_handler(
    db: Database, clock: FakeClock, kind: ProbePush | None = None
) -> tuple[PushJobHandler[str, Probe], ProbePush, Answers, FakeProvider, Metrics]:
    metrics = Metrics()
    kind, answers, fake = kind or ProbePush(), Answers(), FakeProvider()
    handler = PushJobHandler(
        kind,
        answers,
        db=db,
        providers=Providers({"fake": fake}, max_in_flight=8),
        clock=clock,
        metrics=metrics,
    )
    return handler, kind, answers, fake, metrics


def assert_every_end(
    results: Mapping[int, JobResult], metrics: Metrics, answers: Answers, fake: FakeProvider
) -> None:
    """The results, counts and sends of :data:`BATCH`, however it was run."""
    assert results[1] == Fail(MALFORMED_ARGS)
    assert results[2] == Done(Result.SKIPPED_NO_REGISTRATION)
    assert metrics.skipped("no_registration") == 1
    assert results[3] == Done(Result.HELD)
    # A delivery's effect is the kind's; every other answer's the lifecycle's.
    assert results[4] == Done(Result.DELIVERED, BatchedEffect(_written, ("delivered", "reg-4")))
    assert results[5] == Done(Result.DEAD, BatchedEffect(_written, ("lifecycle", "reg-5")))
    retry = results[6]
    assert isinstance(retry, Retry)
    assert (retry.error, retry.effect) == (
        "fake_transient",
        BatchedEffect(_written, ("lifecycle", "reg-6")),
    )
    assert results[7] == Fail("fake_transient", BatchedEffect(_written, ("lifecycle", "reg-7")))
    assert sorted(answers.seen) == [
        ("dead-1", OutcomeKind.DEAD, False),
        ("ok", OutcomeKind.DELIVERED, False),
        ("transient-1", OutcomeKind.TRANSIENT, False),
        ("transient-2", OutcomeKind.TRANSIENT, True),
    ]
    assert sorted(s.token for s in fake.sends) == ["dead-1", "ok", "transient-1", "transient-2"]
    observed = metrics.registry.get_sample_value("bothy_delivery_seconds_count", {"route": "push"})
    assert observed == 2  # the delivery and the dead answer; never a transient one


async def test_a_kind_of_a_few_lines_gets_every_end_of_a_push_job(
    db: Database, clock: FakeClock
) -> None:
    handler, kind, answers, fake, metrics = make_handler(db, clock)
    results: dict[int, JobResult] = {}

    async def report(j: Job, result: JobResult) -> None:
        assert j.id not in results
        results[j.id] = result

    await handler.run_batch(batch(), report)

    assert kind.plans == 1  # one database call for the batch
    assert_every_end(results, metrics, answers, fake)


async def test_checks_run_at_the_claim_end_every_job_as_the_handler_does(
    db: Database, clock: FakeClock
) -> None:
    handler, kind, answers, fake, metrics = make_handler(db, clock)
    assert isinstance(handler, ChecksAtClaim)
    jobs = batch()
    # What the runner does: the checks on the claim's connection (each statement on
    # its own), then the checked handler with the same jobs.
    checks = await db.run(lambda c: handler.check(c, jobs, clock.now()), transaction=False)
    assert kind.plans == 1
    assert answers.seen == [] and fake.sends == []  # nothing sent by the checks
    results: dict[int, JobResult] = {}

    async def report(j: Job, result: JobResult) -> None:
        assert j.id not in results
        results[j.id] = result

    await handler.checked(checks).run_batch(jobs, report)

    assert kind.plans == 1  # the checked handler reads nothing more
    assert_every_end(results, metrics, answers, fake)


class Checks(Instrument):
    def __init__(self) -> None:
        self.checked: list[Mapping[str, Any]] = []

    def jobs_checked(self, args: Sequence[Mapping[str, Any]]) -> None:
        self.checked.extend(args)


async def run_through_the_runner(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock, kind: ProbePush
) -> tuple[dict[str, float], list[Mapping[str, Any]], list[tuple[str, int]]]:
    """:data:`BATCH` inserted, run by a real runner until recorded: the results by
    label, the args the claim checked, and each job's (state, attempt)."""
    handler, _kind, _answers, _fake, metrics = make_handler(db, clock, kind)
    at = clock.now()
    specs = [JobSpec("test.push", args, at, 3) for args, _attempt in BATCH]
    await db.run(lambda c: queue.insert(c, specs, at))
    checks = Checks()
    runner = JobRunner(
        db=db,
        database_url=database_url,
        clock=clock,
        handlers=[handler],
        config=JobsConfig(),
        poll_interval=timedelta(milliseconds=50),
        metrics=metrics,
        instrument=checks,
    )
    await nursery.start(runner.run)
    with trio.fail_after(10):
        while runner.statistics()["recorded"] < len(BATCH):
            await trio.sleep(0.01)
    runner.stop_claiming()
    with trio.fail_after(10):
        await runner.wait_idle()
    finished: dict[str, float] = {}
    for metric in metrics.jobs_finished.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                finished[sample.labels["result"]] = sample.value
    rows = await db.run(
        lambda c: c.execute("SELECT state, attempt FROM bothy.jobs ORDER BY id").fetchall()
    )
    return finished, checks.checked, [(str(s), int(a)) for s, a in rows]


RECORDED = {
    "fail": 1.0,  # malformed
    "skipped_no_registration": 1.0,
    "held": 1.0,
    "delivered": 1.0,
    "dead": 1.0,
    "retry": 2.0,  # both transient answers: each job's first attempt here
}
STATES = [
    ("failed", 1),
    ("completed", 1),
    ("completed", 1),
    ("completed", 1),
    ("completed", 1),
    ("available", 1),
    ("available", 1),
]


async def test_the_runner_claims_push_jobs_checked_and_records_every_result(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    kind = ProbePush()
    finished, checked, rows = await run_through_the_runner(nursery, db, database_url, clock, kind)

    assert len(checked) == len(BATCH)  # every job planned in the claim's call
    assert kind.plans >= 1
    assert finished == RECORDED
    assert rows == STATES


async def test_checks_that_fail_at_the_claim_leave_the_jobs_to_their_handler(
    nursery: trio.Nursery, db: Database, database_url: str, clock: FakeClock
) -> None:
    kind = ProbePush(failing_plans=1)  # the claim's plan fails, the handler's does not
    finished, checked, rows = await run_through_the_runner(nursery, db, database_url, clock, kind)

    assert checked == []
    assert kind.plans >= 2 and kind.failing_plans == 0
    assert finished == RECORDED  # nothing lost, nothing recorded twice
    assert rows == STATES


def test_every_skip_reason_has_its_skipped_result() -> None:
    assert {reason.result.value for reason in SkipReason} == {
        f"skipped_{reason.value}" for reason in SkipReason
    }
    assert all(isinstance(reason.result, Result) for reason in SkipReason)
