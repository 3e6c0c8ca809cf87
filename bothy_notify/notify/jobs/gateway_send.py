"""``notify.gateway_send``: one ``notification.created`` per (hint, recipient).

Step 1, in a transaction: too old (``push.max_age``): skip ``expired``; the
recipient is inactive or has no access to the thread now: skip ``no_access``;
read the thread's current space and channel (it may have moved).
Step 2, outside any transaction: with no publisher in this process skip
``no_registration`` (and warn once); else publish once with audience = the
recipient. At least once: the client replaces hints by thread id. ``mv`` is
the catalogue version the job carries, fixed when the hint was decided.

The result says what the publish reached: ``published`` when the event was
queued to at least one connection, ``skipped_no_connection`` (counted as the
skip ``no_connection``) when it reached none, because the connection ended
meanwhile, admission refused it, or its queue was full. In a cluster the job
runs on the node holding the recipient's connections (``JobSpec.node_id``); if
that node is gone first, the node registry ends it as ``node_gone``
(:mod:`bothy_notify.cluster`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import Clock, from_unix_micros
from bothy_notify.kernel.ephemeral import EphemeralEvent, EphemeralPublisher
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.notify import facts
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import GATEWAY_SEND, GatewaySendArgs
from bothy_notify.notify.jobs.push_send import hint_age_exceeded
from bothy_notify.runner import Done, Report
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job

log = logging.getLogger("bothy.notify.gateway_send")

NOTIFICATION_CREATED = "notification.created"


class GatewaySendHandler:
    """Runs ``notify.gateway_send`` jobs.

    Args:
        publisher: the hub's publisher, or ``None`` on a node without a gateway.
        catalogue_version: the version sent as ``mv`` for a job that carries none
            (queued before the version was fixed at decision); ``None`` omits it.
    """

    kind = GATEWAY_SEND

    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        config: PushConfig,
        metrics: Metrics,
        publisher: EphemeralPublisher | None,
        catalogue_version: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._db = db
        self._clock = clock
        self._config = config
        self._metrics = metrics
        self._publisher = publisher
        self._mv = catalogue_version
        self._warned = False

    def __repr__(self) -> str:
        return f"GatewaySendHandler(publisher={self._publisher is not None})"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        now = self._clock.now()
        parsed = {job.id: GatewaySendArgs.from_args(job.args) for job in jobs}
        # Step 1 is one statement, so it is its own transaction (no BEGIN/COMMIT trips).
        checked = await self._db.run(lambda c: self._check(c, parsed, now), transaction=False)
        for job in jobs:
            args = parsed[job.id]
            verdict = checked[job.id]
            if isinstance(verdict, SkipReason):
                self._metrics.skip(verdict.value)
                await report(job, Done(f"skipped_{verdict.value}"))
                continue
            if self._publisher is None:
                if not self._warned:
                    self._warned = True
                    log.warning("gateway hint on a node without a gateway; skipped")
                self._metrics.skip(SkipReason.NO_REGISTRATION.value)
                await report(job, Done("skipped_no_registration"))
                continue
            event = self._event(args, verdict, self._clock.now())
            if await self._publisher.publish(event):
                await report(job, Done("published"))
            else:
                self._metrics.skip(SkipReason.NO_CONNECTION.value)
                await report(job, Done("skipped_no_connection"))

    def _check(
        self, conn: Conn, parsed: dict[int, GatewaySendArgs], now: datetime
    ) -> dict[int, dict[str, str] | SkipReason]:
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for a in parsed.values()})
        out: dict[int, dict[str, str] | SkipReason] = {}
        for job_id, a in parsed.items():
            now_reach = reach[(a.user_id, a.thread_id)]
            if hint_age_exceeded(a.due_at, now, self._config):
                out[job_id] = SkipReason.EXPIRED
            elif not now_reach.allowed:
                out[job_id] = SkipReason.NO_ACCESS
            elif a.thread_id is None:
                out[job_id] = {}
            else:
                scope = {"thread_id": a.thread_id}
                if now_reach.space_id:
                    scope["space_id"] = now_reach.space_id
                if now_reach.channel_id:
                    scope["channel_id"] = now_reach.channel_id
                out[job_id] = scope
        return out

    def _event(self, a: GatewaySendArgs, scope: dict[str, str], now: datetime) -> EphemeralEvent:
        payload: dict[str, object] = {"nid": a.nid, "kind": a.kind}
        if a.thread_id is not None:
            payload["thread_id"] = a.thread_id
        if a.message_id is not None:
            payload["message_id"] = a.message_id
        if a.target_id is not None:
            payload["target_id"] = a.target_id
        payload["quiet"] = a.quiet
        payload["count"] = a.count
        mv = a.mv if a.mv is not None else self._mv()
        if mv is not None:
            payload["mv"] = mv
        return EphemeralEvent(
            type=NOTIFICATION_CREATED,
            id=new_id(),
            occurred_at=now,
            audience=a.user_id,
            resource_kind="thread" if a.thread_id is not None else "user",
            resource_id=a.thread_id if a.thread_id is not None else a.user_id,
            scope=scope,
            payload=payload,
            appended_at=from_unix_micros(a.appended_at),
        )
