"""``topics.push_send``: one content-free topic push to one recipient, and what its
answer does to the recipient (the recipient lifecycle of topic mode).

Per claimed batch, one transaction reads the recipients still there and each
job's previous error; then every send goes through the
:class:`~bothy_notify.push.registry.Providers` port, outside any transaction,
with a :class:`~bothy_notify.push.port.TopicMessage`.

Outcomes (recipients are not registrations: nothing is written per delivery,
and a dead one is deleted, not invalidated):

==============  ================================================================
delivered       nothing written
dead            the recipient is deleted, but only while its stored delivery
                config still equals the one this send used (a register in
                between keeps it); counted ``recipients{action="dead"}``
mismatch        kept, one attempt (a wrong environment, bundle id or FCM project
                says so for every recipient at once: it must delete nothing)
rejected        kept, one attempt
transient       retried after the provider's minimum delay, backoff and jitter
                up to ``push.max_attempts``, then counted ``failed``; no strikes
==============  ================================================================

A webhook answering 404 or 410 is dead only when every attempt answered so:
the job's previous error carries the streak across attempts. Before sending,
a job older than ``push.max_age`` (from the round's decision) is dropped as
``skipped_expired``, and a job whose recipient is gone as
``skipped_no_recipient``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import trio

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import Clock, from_unix_micros
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.push.port import Outcome, OutcomeKind, Target, TopicMessage
from bothy_notify.push.registry import Providers
from bothy_notify.runner import Defer, Done, Fail, JobResult, Report, retry_or_fail
from bothy_notify.store import topics as store
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job
from bothy_notify.topics.model import b64

log = logging.getLogger("bothy.topics.send")

PERMIT_WAIT = timedelta(seconds=1)
"""How long a send waits for a permit of its channel before the job goes back to the
queue uncounted (the same rule as ``notify.push_send``)."""
_RANDOM = random.Random()  # noqa: S311 - spreading deferred jobs, not cryptography


@dataclass(frozen=True, slots=True)
class TopicSendArgs:
    """``topics.push_send`` args: the envelope's seq, the recipient and topic in hex,
    the envelope's append time (the database's clock, for the latency metric) and
    the round's time of decision (the daemon's clock, for ``push.max_age``), both
    in Unix microseconds. IDs and integers only."""

    seq: int
    recipient_id: bytes
    topic: bytes
    appended_at: int
    due_at: int

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> TopicSendArgs | None:
        """Parse stored args; ``None`` when they are not what the round writes."""
        try:
            seq, appended_at, due_at = args["seq"], args["appended_at"], args["due_at"]
            recipient_id = bytes.fromhex(args["recipient_id"])
            topic = bytes.fromhex(args["topic"])
        except (KeyError, TypeError, ValueError):
            return None
        if not all(isinstance(v, int) for v in (seq, appended_at, due_at)):
            return None
        return cls(seq, recipient_id, topic, appended_at, due_at)

    def to_args(self) -> dict[str, int | str]:
        return {
            "seq": self.seq,
            "recipient_id": self.recipient_id.hex(),
            "topic": self.topic.hex(),
            "appended_at": self.appended_at,
            "due_at": self.due_at,
        }

    def __repr__(self) -> str:
        return f"TopicSendArgs(seq={self.seq})"


@dataclass(frozen=True, slots=True)
class _Plan:
    args: TopicSendArgs
    recipient: store.Recipient
    previous_error: str | None


class TopicPushHandler:
    """Runs ``topics.push_send`` jobs."""

    kind = store.TOPIC_PUSH_SEND

    def __init__(
        self,
        *,
        db: Database,
        providers: Providers,
        clock: Clock,
        config: PushConfig,
        metrics: Metrics,
    ) -> None:
        self._db = db
        self._providers = providers
        self._clock = clock
        self._config = config
        self._metrics = metrics

    def __repr__(self) -> str:
        return "TopicPushHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        now = self._clock.now()
        parsed = {job.id: TopicSendArgs.from_args(job.args) for job in jobs}
        wanted = {a.recipient_id for a in parsed.values() if a is not None}
        ids = [job.id for job in jobs]

        def facts(conn: Conn) -> tuple[dict[bytes, store.Recipient], dict[int, str | None]]:
            return store.load_recipients(conn, wanted), store.previous_errors(conn, ids)

        recipients, errors = await self._db.run(facts)
        async with trio.open_nursery() as nursery:
            for job in jobs:
                args = parsed[job.id]
                if args is None:
                    log.error("a topics.push_send job has malformed args; dropped")
                    await report(job, Fail("malformed_args"))
                    continue
                recipient = recipients.get(args.recipient_id)
                if recipient is None:
                    await report(job, Done("skipped_no_recipient"))
                elif self._too_old(args, now):
                    await report(job, Done("skipped_expired"))
                else:
                    plan = _Plan(args, recipient, errors.get(job.id))
                    nursery.start_soon(self._send, job, plan, report)

    def _too_old(self, args: TopicSendArgs, now: datetime) -> bool:
        return now - from_unix_micros(args.due_at) > self._config.max_age

    async def _send(self, job: Job, plan: _Plan, report: Report) -> None:
        config = plan.recipient.config
        message = TopicMessage(plan.args.topic, plan.args.seq, plan.args.recipient_id)
        outcome = await self._providers.try_send(
            self._target(job, plan), message, permit_wait=PERMIT_WAIT.total_seconds()
        )
        if outcome is None:
            await report(job, Defer(PERMIT_WAIT * (1 + _RANDOM.random()), "provider_busy"))
            return
        if outcome.kind is not OutcomeKind.TRANSIENT:
            self._metrics.delivery_seconds.labels("topic").observe(
                max(0.0, time.time() - plan.args.appended_at / 1_000_000)
            )
        result = self.result_for(job, plan.recipient, outcome)
        label = "failed" if isinstance(result, Fail) else _LABELS.get(outcome.kind)
        if label is not None:
            self._metrics.topic_deliveries.labels(config.channel, label).inc()
        await report(job, result)

    def _target(self, job: Job, plan: _Plan) -> Target:
        config = plan.recipient.config
        previous = plan.previous_error
        return Target(
            registration_id=plan.args.recipient_id.hex(),
            user_id="",
            provider=config.channel,
            token=config.delivery,
            platform="",
            environment=config.environment,
            signing_key=None if config.signing_key is None else b64(config.signing_key),
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            # The previous attempt's answer: the webhook's "every attempt 404/410" streak.
            last_error=previous,
            failure_count=1 if previous else 0,
        )

    def result_for(self, job: Job, recipient: store.Recipient, outcome: Outcome) -> JobResult:
        """The job result and recipient effect of one answer (see the module docstring)."""
        if outcome.kind is OutcomeKind.DEAD:
            config = recipient.config
            rid = recipient.recipient_id

            def delete(conn: Conn, _now: datetime) -> None:
                if store.delete_if_unchanged(conn, rid, config):
                    self._metrics.topic_recipients.labels("dead").inc()

            return Done("dead", delete)
        if outcome.kind is OutcomeKind.TRANSIENT:
            return retry_or_fail(job, outcome.reason or "transient", outcome.retry_after)
        return Done(outcome.kind.value)


_LABELS = {
    OutcomeKind.DELIVERED: "delivered",
    OutcomeKind.DEAD: "dead",
    OutcomeKind.MISMATCH: "mismatch",
    OutcomeKind.REJECTED: "rejected",
}
"""Outcome -> ``bothy_topic_deliveries_total{outcome}``; a transient one counts only
as ``failed`` once its attempts are spent."""
