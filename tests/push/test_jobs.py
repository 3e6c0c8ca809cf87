"""The one push handler (``push/jobs.py``) running a kind defined here in a few lines:
what every kind of push gets without writing it (malformed args, counted skips, its
own results, retries and failure, the lifecycle's and the kind's effects, the
delivery latency), against the real database and the fake provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.jobs import MALFORMED_ARGS, PushJobHandler, PushKind
from bothy_notify.push.port import Outcome, OutcomeKind, ReadMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import BatchedEffect, Done, Fail, JobResult, Retry
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job


@dataclass(frozen=True, slots=True)
class Probe:
    target: Target


def _written(conn: Conn, items: list[str], now: datetime) -> None:
    """An effect: the handler hands it to the runner, which applies it."""


class ProbePush(PushKind[str, Probe]):
    """A whole kind of push: args ``{"token"}``; ``gone`` is skipped, ``held`` held."""

    kind = "test.push"
    plan_writes = False

    def __init__(self) -> None:
        self.plans = 0

    def parse(self, args: Mapping[str, Any]) -> str | None:
        token = args.get("token")
        return token if isinstance(token, str) else None

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, str]], now: datetime
    ) -> dict[int, Probe | SkipReason | Done]:
        self.plans += int(conn.execute("SELECT 1").fetchone()[0])  # type: ignore[index]
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


async def test_a_kind_of_a_few_lines_gets_every_end_of_a_push_job(
    db: Database, clock: FakeClock
) -> None:
    metrics = Metrics()
    kind, answers, fake = ProbePush(), Answers(), FakeProvider()
    handler = PushJobHandler(
        kind,
        answers,
        db=db,
        providers=Providers({"fake": fake}, max_in_flight=8),
        clock=clock,
        metrics=metrics,
    )
    jobs = [
        job(1, {"nothing": 1}),
        job(2, {"token": "gone"}),
        job(3, {"token": "held"}),
        job(4, {"token": "ok"}),
        job(5, {"token": "dead-1"}),
        job(6, {"token": "transient-1"}),
        job(7, {"token": "transient-2"}, attempt=3),
    ]
    results: dict[int, JobResult] = {}

    async def report(j: Job, result: JobResult) -> None:
        assert j.id not in results
        results[j.id] = result

    await handler.run_batch(jobs, report)

    assert kind.plans == 1  # one database call for the batch
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


def test_every_skip_reason_has_its_skipped_result() -> None:
    assert {reason.result.value for reason in SkipReason} == {
        f"skipped_{reason.value}" for reason in SkipReason
    }
    assert all(isinstance(reason.result, Result) for reason in SkipReason)
