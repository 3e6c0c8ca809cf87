"""``topics.push_send``: one content-free topic push to one recipient, and what its
answer does to the recipient (the recipient lifecycle of topic mode).

A :class:`~bothy_notify.push.jobs.PushKind` (:class:`TopicPush`) run by the one
push handler, with its own :class:`RecipientLifecycle`. Per claimed batch, one
database call reads the recipients still there and each job's previous error;
then every send goes through the :class:`~bothy_notify.push.registry.Providers`
port, outside any transaction, with a :class:`~bothy_notify.push.port.TopicMessage`.

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
``skipped_no_recipient`` (neither counted in ``bothy_push_skipped_total``, which
is person mode's). Every answer counts ``bothy_topic_deliveries_total`` (a
transient one only once its attempts are spent, as ``failed``) and, unless
transient, ``bothy_delivery_seconds{route="topic"}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import from_unix_micros
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import Outcome, OutcomeKind, Target, TopicMessage
from bothy_notify.runner import Done, Effect
from bothy_notify.store import topics as store
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job
from bothy_notify.topics.model import b64


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
class TopicSend:
    """A topic push planned: its args, its recipient, and where the push goes."""

    args: TopicSendArgs
    recipient: store.Recipient
    target: Target


class TopicPush(PushKind[TopicSendArgs, TopicSend]):
    """``topics.push_send``: the recipient still there and the age checked, one
    :class:`~bothy_notify.push.port.TopicMessage`."""

    kind = store.TOPIC_PUSH_SEND
    plan_writes = False

    def __init__(self, *, config: PushConfig) -> None:
        self._config = config

    def parse(self, args: Mapping[str, Any]) -> TopicSendArgs | None:
        return TopicSendArgs.from_args(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, TopicSendArgs]], now: datetime
    ) -> dict[int, TopicSend | SkipReason | Done]:
        recipients = store.load_recipients(conn, {a.recipient_id for _job, a in claimed})
        errors = store.previous_errors(conn, [job.id for job, _a in claimed])
        plans: dict[int, TopicSend | SkipReason | Done] = {}
        for job, a in claimed:
            recipient = recipients.get(a.recipient_id)
            if recipient is None:
                plans[job.id] = Done(Result.SKIPPED_NO_RECIPIENT)
            elif now - from_unix_micros(a.due_at) > self._config.max_age:
                plans[job.id] = Done(Result.SKIPPED_EXPIRED)
            else:
                plans[job.id] = TopicSend(a, recipient, _target(job, recipient, errors.get(job.id)))
        return plans

    def message(self, plan: TopicSend) -> TopicMessage:
        return TopicMessage(plan.args.topic, plan.args.seq, plan.args.recipient_id)

    def route(self, plan: TopicSend) -> tuple[str, int]:
        return ("topic", plan.args.appended_at)


def _target(job: Job, recipient: store.Recipient, previous: str | None) -> Target:
    config = recipient.config
    return Target(
        registration_id=recipient.recipient_id.hex(),
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


class RecipientLifecycle:
    """The :class:`~bothy_notify.push.jobs.Lifecycle` of topic recipients (see the
    module docstring): a dead recipient deleted while its delivery config is the
    one the send used, every answer counted by channel."""

    def __init__(self, *, metrics: Metrics) -> None:
        self._metrics = metrics
        self._deliveries = Children(metrics.topic_deliveries)

    def __repr__(self) -> str:
        return "RecipientLifecycle()"

    def answered(self, plan: TopicSend, outcome: Outcome, *, last_attempt: bool) -> Effect | None:
        kind = outcome.kind
        if kind is not OutcomeKind.TRANSIENT:
            self._deliveries(plan.target.provider, kind.value).inc()
        elif last_attempt:
            self._deliveries(plan.target.provider, "failed").inc()
        if kind is not OutcomeKind.DEAD:
            return None
        config = plan.recipient.config
        rid = plan.recipient.recipient_id

        def delete(conn: Conn, _now: datetime) -> None:
            if store.delete_if_unchanged(conn, rid, config):
                self._metrics.topic_recipients.labels("dead").inc()

        return delete
