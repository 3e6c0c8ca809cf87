"""``notify.push_send``: one push to one registration.

Checks, in one transaction for the whole claimed batch (SPEC section 7):

1. The registration is still active and still the recipient's: else skip
   ``no_registration``.
2. The hint is not older than ``push.max_age``: else skip ``expired``.
3. The recipient is an active human with read access to the thread now: else
   skip ``no_access``.
4. Release check, only for a delayed push (``release_seq > 0``): the read
   position reached ``release_seq``: skip ``read``. An immediate push reads
   nothing extra, and a delayed push re-evaluates nothing else. Beside it, for
   every push about a message: the message was deleted (``message.deleted``):
   skip ``deleted``, asked only when the thread's row, read for the access check
   anyway, says it had a recent deletion (:attr:`~bothy_notify.notify.facts.Reach.
   deletions`), so a push in a thread without deletions costs nothing more.
5. Quiet hours (issue 20): a person in quiet hours, for a category that does not
   break through (``security`` always does), has the push held, not sent: result
   ``held``, a row of ``bothy.held_pushes`` and, for the first of the period, the
   person's ``notify.quiet_summary`` at its end (:mod:`bothy_notify.store.quiet`,
   :mod:`bothy_notify.notify.jobs.quiet_summary`). One statement for the batch.
6. The badge (``push.badge = "unread_threads"``): the unread threads of every
   person the batch sends to, in one statement for the batch
   (:func:`bothy_notify.store.unread.badges_of`), so a delayed push carries the
   count of its moment and a send costs no query of its own.

Then the provider send, outside any transaction. Its outcome becomes the job's
result here (a transient outcome retries while attempts remain, and the send
fails after the last one), and its effect on the registration comes from the
token lifecycle (:mod:`bothy_notify.notify.lifecycle`), committed together with
the result. A delivered hint about a thread also marks (registration, thread) in
that commit, for clear-on-read (:mod:`bothy_notify.store.marks`,
:mod:`bothy_notify.notify.jobs.push_clear`). :class:`Sending` is the send and its
result, shared with ``notify.push_clear``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import trio

from bothy_notify.config import BadgeMode, NotifyConfig, PushConfig
from bothy_notify.kernel.clock import Clock, from_unix_micros
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify import facts
from bothy_notify.notify.catalogue import Catalogue
from bothy_notify.notify.domain import SkipReason, release_delayed
from bothy_notify.notify.domain.quiet import hold_until
from bothy_notify.notify.jobs.args import PUSH_SEND, PushSendArgs
from bothy_notify.notify.lifecycle import TokenLifecycle, send_outcome
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.port import Message, Outcome, OutcomeKind, PushMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import BatchedEffect, Defer, Done, JobResult, Report, retry_or_fail
from bothy_notify.store import deletions, marks
from bothy_notify.store import quiet as quiet_store
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job
from bothy_notify.store.unread import badges_of

PERMIT_WAIT = timedelta(seconds=1)
"""How long a send waits for a permit of its provider's channel before the job goes
back to the queue (a healthy provider frees permits in milliseconds)."""
_DEFAULT_NOTIFY = NotifyConfig()
"""Where a handler built without ``urgency_of`` reads each kind's default urgency."""
_RANDOM = random.Random()  # noqa: S311 - spreading retries, not cryptography


@fast_init
@dataclass(frozen=True, slots=True)
class _Send:
    args: PushSendArgs
    target: Target
    badge: int | None = None


_BUILTIN_CATALOGUE = Catalogue.builtin()
"""Where a handler built without ``category_of`` finds a kind's category."""

P = TypeVar("P")
"""What a push job's check plans for a job it sends (:meth:`Sending.run_plans`)."""

HELD = "held"
"""The result of a push held for quiet hours."""


def still_active(
    found: tuple[regs.Registration, str] | None, user_id: str
) -> tuple[regs.Registration, str] | None:
    """A loaded registration (and its platform) if it may still be sent to: it exists,
    is active and still belongs to the job's person; else ``None`` (the send is
    skipped ``no_registration``)."""
    if found is None or found[0].invalidated_at is not None or found[0].user_id != user_id:
        return None
    return found


def target_of(reg: regs.Registration, platform: str, attempts: tuple[int, int]) -> Target:
    """Where a push to ``reg`` goes, on its job's ``(attempt, max_attempts)``."""
    return Target(
        registration_id=reg.id,
        user_id=reg.user_id,
        provider=reg.provider,
        token=reg.token,
        platform=platform,
        environment=reg.environment,
        app_id=reg.app_id,
        signing_key=reg.signing_key,
        attempt=attempts[0],
        max_attempts=attempts[1],
        last_error=reg.error_since_delivery,
        failure_count=reg.failure_count,
        expires_at=reg.expires_at,
    )


def hint_age_exceeded(due_at_micros: int, now: datetime, config: PushConfig) -> bool:
    return now - from_unix_micros(due_at_micros) > config.max_age


class Sending:
    """One provider send and its job result, the same for every push job
    (``notify.push_send``, ``notify.push_clear``): the send through
    :meth:`Providers.try_send`, a busy provider deferring the job, the send metric,
    the rejection log, and the result with the token lifecycle's effect."""

    def __init__(self, *, providers: Providers, config: PushConfig, metrics: Metrics) -> None:
        self._providers = providers
        self._metrics = metrics
        self._sends = Children(metrics.push_sends)
        self.lifecycle = TokenLifecycle(config=config, metrics=metrics)

    def __repr__(self) -> str:
        return "Sending()"

    async def run_plans(
        self,
        jobs: Sequence[Job],
        plans: Mapping[int, P | SkipReason | Done],
        report: Report,
        send: Callable[[Job, P, Report], Awaitable[None]],
    ) -> None:
        """Report each job whose check stopped it (a skip, counted, or a result of
        its own) and ``send`` the others concurrently, each reporting its own."""
        async with trio.open_nursery() as nursery:
            for job in jobs:
                plan = plans[job.id]
                if isinstance(plan, SkipReason):
                    self._metrics.skip(plan.value)
                    await report(job, Done(f"skipped_{plan.value}"))
                elif isinstance(plan, Done):
                    await report(job, plan)
                else:
                    nursery.start_soon(send, job, plan, report)

    async def send(
        self, job: Job, target: Target, message: Message, report: Report
    ) -> Outcome | None:
        """The outcome of sending ``message``, or ``None`` once the job is deferred
        (the provider is stalled and all its permits are taken)."""
        outcome = await self._providers.try_send(
            target, message, permit_wait=PERMIT_WAIT.total_seconds()
        )
        if outcome is None:
            # Give the runner slot back so other providers' sends are not held up.
            after = PERMIT_WAIT * (1 + _RANDOM.random())
            await report(job, Defer(after, "provider_busy"))
            return None
        last_attempt = job.attempt >= job.max_attempts
        self._sends(
            target.provider,
            send_outcome(outcome, last_attempt=last_attempt),
            self._providers.app_label(target),
        ).inc()
        self.lifecycle.explain(target.provider, outcome)
        return outcome

    def result_for(
        self,
        job: Job,
        target: Target,
        outcome: Outcome,
        delivered: BatchedEffect | None = None,
    ) -> JobResult:
        """The job result of one outcome, carrying its registration effect
        (``delivered`` replaces the lifecycle's for a delivery: it must apply that
        too: :func:`~bothy_notify.store.registrations.mark_delivered_many`).

        A transient outcome retries while attempts remain (no sooner than the
        provider's minimum); after the last attempt the send has failed and the job
        fails. Every other outcome finishes the job.
        """
        last_attempt = job.attempt >= job.max_attempts
        effect = self.lifecycle.effect(
            target.registration_id, target.provider, outcome, last_attempt=last_attempt
        )
        if outcome.kind is OutcomeKind.TRANSIENT:
            return retry_or_fail(job, outcome.reason or "transient", outcome.retry_after, effect)
        if outcome.kind is OutcomeKind.DELIVERED and delivered is not None:
            effect = delivered
        return Done(outcome.kind.value, effect)


def _delivered_marked(conn: Conn, items: list[tuple[str, str, str]], now: datetime) -> None:
    """Deliveries of hints about threads: the lifecycle's effect, and each
    (registration, thread) marked for clear-on-read (:mod:`bothy_notify.store.marks`)."""
    regs.mark_delivered_many(conn, [(r, p) for r, p, _t in items], now)
    marks.record_many(conn, [(r, t) for r, _p, t in items], now)


class PushSendHandler:
    """Runs ``notify.push_send`` jobs.

    ``mv`` is the catalogue version the job carries (fixed when the hint was
    decided); ``catalogue_version`` gives it for a job queued without one.
    ``urgency_of`` gives a kind's urgency (``[notify.urgency]``). The category a
    quiet-hours hold goes by is the job's own (the recipient's, fixed when
    decided: an app hint names its own); ``category_of`` gives it, from the kind
    catalogue, for a job queued without one. ``grouping`` gives a thread's grouping
    value (:mod:`bothy_notify.push.grouping`); ``None``: pushes carry none.
    """

    kind = PUSH_SEND

    def __init__(
        self,
        *,
        db: Database,
        providers: Providers,
        clock: Clock,
        config: PushConfig,
        metrics: Metrics,
        catalogue_version: Callable[[], str | None] = lambda: None,
        urgency_of: Callable[[str], str] = _DEFAULT_NOTIFY.urgency_of,
        category_of: Callable[[str], str] = _BUILTIN_CATALOGUE.category_of,
        grouping: ThreadGrouping | None = None,
    ) -> None:
        self._db = db
        self._grouping = grouping
        self._urgency_of = urgency_of
        self._category_of = category_of
        self._held = Children(metrics.push_held)
        self._providers = providers
        self._clock = clock
        self._config = config
        self._metrics = metrics
        self._mv = catalogue_version
        self._delivery = Children(metrics.delivery_seconds)
        self.sending = Sending(providers=providers, config=config, metrics=metrics)
        self.lifecycle = self.sending.lifecycle

    def __repr__(self) -> str:
        return "PushSendHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        now = self._clock.now()
        parsed = {job.id: PushSendArgs.from_args(job.args) for job in jobs}
        attempts = {job.id: (job.attempt, job.max_attempts) for job in jobs}
        # Two reads, each its own statement: under READ COMMITTED a transaction would
        # give them no common snapshot either, only BEGIN and COMMIT round trips.
        plans = await self._db.run(
            lambda c: self._check(c, parsed, attempts, now), transaction=False
        )
        await self.sending.run_plans(jobs, plans, report, self._send)

    def _check(
        self,
        conn: Conn,
        parsed: dict[int, PushSendArgs],
        attempts: dict[int, tuple[int, int]],
        now: datetime,
    ) -> dict[int, _Send | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for a in parsed.values()})
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for a in parsed.values()})
        plans: dict[int, _Send | SkipReason | Done] = {}
        maybe_deleted: dict[int, tuple[str, str]] = {}
        for job_id, a in parsed.items():
            found = still_active(loaded.get(a.registration_id), a.user_id)
            if found is None:
                plans[job_id] = SkipReason.NO_REGISTRATION
                continue
            if hint_age_exceeded(a.due_at, now, self._config):
                plans[job_id] = SkipReason.EXPIRED
                continue
            now_reach = reach[(a.user_id, a.thread_id)]
            if not now_reach.allowed:
                plans[job_id] = SkipReason.NO_ACCESS
                continue
            # The release check reads only the read position, and only for a delayed push.
            if a.release_seq > 0 and not release_delayed(a.release_seq, now_reach.read_position):
                plans[job_id] = SkipReason.READ
                continue
            if now_reach.deletions and a.thread_id is not None and a.message_id is not None:
                maybe_deleted[job_id] = (a.thread_id, a.message_id)
            reg, platform = found
            plans[job_id] = _Send(
                a,
                target_of(reg, platform, attempts[job_id]),
            )
        if maybe_deleted:  # only in a thread with a recent deletion
            gone = deletions.deleted_among(conn, set(maybe_deleted.values()))
            for job_id, key in maybe_deleted.items():
                if key in gone:
                    plans[job_id] = SkipReason.DELETED
        self._hold_quiet(conn, plans, now)
        if self._config.badge is BadgeMode.UNREAD_THREADS:
            sending = {p.args.user_id for p in plans.values() if isinstance(p, _Send)}
            badges = badges_of(conn, sending)
            for job_id, plan in plans.items():
                if isinstance(plan, _Send):
                    plans[job_id] = _Send(plan.args, plan.target, badges.get(plan.args.user_id, 0))
        return plans

    def _hold_quiet(
        self, conn: Conn, plans: dict[int, _Send | SkipReason | Done], now: datetime
    ) -> None:
        """Hold the planned sends of people in quiet hours (step 5)."""
        docs = quiet_store.docs_of(
            conn, {p.args.user_id for p in plans.values() if isinstance(p, _Send)}
        )
        if not docs:
            return
        ends: dict[tuple[str, str], datetime | None] = {}  # once per person and category
        for job_id, plan in plans.items():
            if not isinstance(plan, _Send) or plan.args.user_id not in docs:
                continue
            a = plan.args
            category = a.category or self._category_of(a.kind)
            key = (a.user_id, category)
            if key not in ends:
                ends[key] = hold_until(facts.hours_of(docs[a.user_id]), category, now)
            ends_at = ends[key]
            if ends_at is not None:
                self._held(category).inc()
                held = quiet_store.Held(a.user_id, a.thread_id, a.nid, category, ends_at)
                plans[job_id] = Done(HELD, BatchedEffect(quiet_store.hold_many, held))

    async def _send(self, job: Job, plan: _Send, report: Report) -> None:
        a = plan.args
        message = PushMessage(
            nid=a.nid,
            kind=a.kind,
            count=a.count,
            quiet=a.quiet,
            thread_id=a.thread_id,
            message_id=a.message_id,
            target_id=a.target_id,
            mv=a.mv if a.mv is not None else self._mv(),
            badge=plan.badge,
            urgency=str(self._urgency_of(a.kind)),
            group=(
                self._grouping.of(a.thread_id)
                if self._grouping is not None and a.thread_id is not None
                else None
            ),
        )
        outcome = await self.sending.send(job, plan.target, message, report)
        if outcome is None:
            return
        if outcome.kind is not OutcomeKind.TRANSIENT:
            route = "push_delayed" if a.release_seq > 0 else "push"
            self._delivery(route).observe(max(0.0, time.time() - a.appended_at / 1_000_000))
        await report(job, self.result_for(job, plan, outcome))

    def result_for(self, job: Job, plan: _Send, outcome: Outcome) -> JobResult:
        """The job result of one outcome (:meth:`Sending.result_for`); a delivered
        hint about a thread also marks the registration for clear-on-read."""
        target = plan.target
        delivered = None
        if plan.args.thread_id is not None:
            delivered = BatchedEffect(
                _delivered_marked, (target.registration_id, target.provider, plan.args.thread_id)
            )
        return self.sending.result_for(job, target, outcome, delivered)
