"""``notify.gateway_send``: one ``notification.created`` per (hint, recipient).

Step 1, in a transaction: too old (``push.max_age``): skip ``expired``; the
recipient is inactive or has no access to the thread now: skip ``no_access``;
read the thread's current space and channel (it may have moved); the message was
deleted meanwhile: skip ``deleted`` (asked only in a thread whose row says it had
a deletion: :attr:`~bothy_notify.notify.facts.Reach.deletions`).
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

Local hints (:class:`LocalGatewayHints`). On a node that decides and holds
the connections (role ``all``), the round inserts the gateway hints it decides
already claimed by this node; right after its commit, step 1 runs for them as
one statement on the round's connection, and the jobs go to the runner in
memory with that verdict. Step 1 is then also the publish's read-access check
(the same rule, read after everything the round committed, with no database
call between it and the frame), so the publisher makes no query of its own.
Jobs claimed the ordinary way (another node's round, a flush, a runner that
had no room) are checked in one statement for the whole batch, in the worker
thread that claimed them (the handler is a ``runner.ChecksAtClaim``; should
that check fail, :meth:`GatewaySendHandler.run_batch` checks them itself), and
that statement stands for the publishes' access check the same way: their
frames follow it with no database call between (before, each publish read
access again, one worker-thread round trip per job, in series).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import Clock, from_unix_micros
from bothy_notify.kernel.ephemeral import EphemeralEvent, EphemeralPublisher
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.notify import facts
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import GATEWAY_SEND, GatewaySendArgs
from bothy_notify.notify.jobs.push_send import hint_age_exceeded
from bothy_notify.runner import Done, JobHandler, JobRunner, Report
from bothy_notify.store import deletions
from bothy_notify.store import jobs as queue
from bothy_notify.store.db import Conn, Database, StoreError
from bothy_notify.store.jobs import ClaimHere, Job

log = logging.getLogger("bothy.notify.gateway_send")

NOTIFICATION_CREATED = "notification.created"

Verdict = dict[str, str] | SkipReason
"""Step 1's answer for one job: the thread's current scope (empty without a thread),
or why it is skipped."""


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
        # Step 1 is one statement, so it is its own transaction (no BEGIN/COMMIT trips).
        checked = await self._db.run(lambda c: self.check(c, jobs, now), transaction=False)
        # Step 1 read access for every job just now, and nothing touches the database
        # before the last frame is queued: it stands for the publishes' own check.
        await self._publish(jobs, checked, report, access_checked=True)

    def checked(self, verdicts: dict[int, Verdict]) -> JobHandler:
        """A handler for jobs whose step 1 already ran (``verdicts`` by job id), in a
        statement whose read-access check also stands for the publish's."""
        return _Checked(self, verdicts)

    def check(self, conn: Conn, jobs: Sequence[Job], now: datetime) -> dict[int, Verdict]:
        """Step 1 for ``jobs``, in one statement on ``conn`` (blocking)."""
        return self._check(conn, {job.id: GatewaySendArgs.from_args(job.args) for job in jobs}, now)

    async def _publish(
        self,
        jobs: Sequence[Job],
        checked: dict[int, Verdict],
        report: Report,
        *,
        access_checked: bool,
    ) -> None:
        """Step 2 for every job, then each job's result. Every publish comes before
        the first report, which may wait for the recorder."""
        results: list[tuple[Job, Done]] = []
        for job in jobs:
            verdict = checked[job.id]
            if isinstance(verdict, SkipReason):
                self._metrics.skip(verdict)
                results.append((job, Done(verdict.result)))
                continue
            if self._publisher is None:
                if not self._warned:
                    self._warned = True
                    log.warning("gateway hint on a node without a gateway; skipped")
                self._metrics.skip(SkipReason.NO_REGISTRATION)
                results.append((job, Done(Result.SKIPPED_NO_REGISTRATION)))
                continue
            args = GatewaySendArgs.from_args(job.args)
            event = self._event(args, verdict, self._clock.now())
            if await self._publisher.publish(event, access_checked=access_checked):
                results.append((job, Done(Result.PUBLISHED)))
            else:
                self._metrics.skip(SkipReason.NO_CONNECTION)
                results.append((job, Done(Result.SKIPPED_NO_CONNECTION)))
        for job, result in results:
            await report(job, result)

    def _check(
        self, conn: Conn, parsed: dict[int, GatewaySendArgs], now: datetime
    ) -> dict[int, Verdict]:
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for a in parsed.values()})
        out: dict[int, Verdict] = {}
        maybe_deleted: dict[int, tuple[str, str]] = {}
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
                if now_reach.deletions and a.message_id is not None:
                    maybe_deleted[job_id] = (a.thread_id, a.message_id)
        if maybe_deleted:  # only in a thread with a recent deletion
            gone = deletions.deleted_among(conn, set(maybe_deleted.values()))
            for job_id, key in maybe_deleted.items():
                if key in gone:
                    out[job_id] = SkipReason.DELETED
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


class _Checked:
    """:class:`GatewaySendHandler` for jobs whose step 1 ran already (see
    :meth:`GatewaySendHandler.checked`); a job without a verdict is checked as usual."""

    kind = GATEWAY_SEND

    def __init__(self, handler: GatewaySendHandler, verdicts: dict[int, Verdict]) -> None:
        self._handler = handler
        self._verdicts = verdicts

    def __repr__(self) -> str:
        return f"_Checked(jobs={len(self._verdicts)})"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        unchecked = [job for job in jobs if job.id not in self._verdicts]
        checked = [job for job in jobs if job.id in self._verdicts]
        await self._handler._publish(checked, self._verdicts, report, access_checked=True)
        if unchecked:
            await self._handler.run_batch(unchecked, report)


@dataclass(frozen=True, slots=True)
class CheckedHints:
    """What :meth:`LocalGatewayHints.prepare` found: step 1's verdict per job id."""

    verdicts: dict[int, Verdict]

    def __repr__(self) -> str:
        return f"CheckedHints(jobs={len(self.verdicts)})"


class LocalGatewayHints:
    """The round's :class:`~bothy_notify.notify.round.LocalJobs` on a node with a
    gateway: the gateway hints it decides for this node go to this node's runner
    right after the commit, checked on the round's connection.

    Args:
        runner: this node's job runner (its room bounds how many are claimed).
        handler: the node's ``notify.gateway_send`` handler.
        db: the jobs pool, to give jobs back when the runner stopped meanwhile.
        clock: the injected clock (step 1's age check).
        lease: ``jobs.lease``.
        node_id: this node's id in a cluster; ``None`` on a single node.
    """

    def __init__(
        self,
        *,
        runner: JobRunner,
        handler: GatewaySendHandler,
        db: Database,
        clock: Clock,
        lease: timedelta,
        node_id: str | None = None,
    ) -> None:
        self._runner = runner
        self._handler = handler
        self._db = db
        self._clock = clock
        self._lease = lease
        self._node_id = node_id
        self._kinds = frozenset({GATEWAY_SEND})

    def __repr__(self) -> str:
        return "LocalGatewayHints()"

    def claim_here(self) -> ClaimHere | None:
        room = self._runner.room()
        if room <= 0:
            return None
        return ClaimHere(kinds=self._kinds, node_id=self._node_id, lease=self._lease, room=room)

    def prepare(self, conn: Conn, jobs: list[Job]) -> object:
        return CheckedHints(self._handler.check(conn, jobs, self._clock.now()))

    async def hand_over(self, jobs: list[Job], prepared: object | None) -> None:
        handler = (
            self._handler.checked(prepared.verdicts) if isinstance(prepared, CheckedHints) else None
        )
        if self._runner.run_claimed(jobs, handler):
            return
        # The runner stopped (shutdown, or it failed) since the round claimed them.
        try:
            await self._db.run(lambda c: queue.release(c, [j.fence for j in jobs]))
        except StoreError:
            log.warning("could not give back gateway hints; their leases will end")
