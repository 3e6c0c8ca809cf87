"""The end of a quiet period: ``notify.quiet_summary`` and its sends (issue 20).

``notify.push_send`` holds the pushes of a person in quiet hours
(:func:`~bothy_notify.store.quiet.hold_many`); the first hold of a period queues
one ``notify.quiet_summary`` ``{user_id}`` at the period's end. That job, in one
transaction:

1. Reads the person's settings now: still quiet (the period was extended, or a
   new one joined it) -> deferred to the new end, nothing taken.
2. Takes every held push (:func:`~bothy_notify.store.quiet.take_held`, which
   also gives the pending summary's key back, so the next hold queues a new one)
   and counts the threads still unread and still readable
   (:func:`~bothy_notify.notify.domain.quiet.summary_count`).
3. Nothing unread -> ``nothing_unread``, no push at all. Else one
   ``notify.push_summary`` per active registration of the person, all with the
   same ``nid`` (the webhook's message id), and ``sent``; with no active
   registration left, ``skipped_no_registration`` (counted as that skip).

``notify.push_summary`` ``{user_id, registration_id, count, nid}`` is a
:class:`~bothy_notify.push.jobs.PushKind` (:class:`SummaryPush`): it checks the
registration as every push to a registration does
(:func:`~.registration_push.still_active`), reads the badge now (one statement
per claimed batch) and sends :class:`~bothy_notify.push.port.SummaryMessage`
``{"kind": "summary", "count", "badge"}`` through the one push handler: the same
outcomes, retries and token lifecycle as a hint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify import facts
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.domain.quiet import quiet_from_doc, quiet_until, summary_count
from bothy_notify.notify.domain.quiet import summary_decision as decide_summary
from bothy_notify.notify.jobs.args import (
    PUSH_SUMMARY,
    QUIET_SUMMARY,
    PushSummaryArgs,
    QuietSummaryArgs,
)
from bothy_notify.notify.jobs.registration_push import (
    DEFAULT_NOTIFY,
    badge_of,
    badges,
    still_active,
    target_of,
)
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import SummaryMessage, Target
from bothy_notify.runner import Defer, Done, Report
from bothy_notify.store import quiet as quiet_store
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job, JobSpec, JobWriter

STILL_QUIET = "still_quiet"
"""The defer reason of a summary whose person is quiet again (or still)."""


class QuietSummaryHandler:
    """Runs ``notify.quiet_summary``: the person's held pushes at the end of their
    quiet period become one summary per registration, or nothing."""

    kind = QUIET_SUMMARY

    def __init__(self, *, db: Database, clock: Clock, config: PushConfig, metrics: Metrics) -> None:
        self._db = db
        self._clock = clock
        self._max_attempts = config.max_attempts
        self._results = Children(metrics.quiet_summaries)
        self._metrics = metrics

    def __repr__(self) -> str:
        return "QuietSummaryHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        for job in jobs:
            user_id = QuietSummaryArgs.from_args(job.args).user_id
            now = self._clock.now()
            outcome = await self._db.run(partial(self._close, user_id=user_id, now=now))
            if isinstance(outcome, datetime):
                await report(job, Defer(max(outcome - now, _SOON), STILL_QUIET))
                continue
            if isinstance(outcome, SkipReason):
                self._metrics.skip(outcome)
                await report(job, Done(outcome.result))
                continue
            self._results(outcome).inc()
            await report(job, Done(outcome))

    def _close(self, conn: Conn, user_id: str, now: datetime) -> datetime | Result | SkipReason:
        """Steps 1-3 in the caller's transaction: the new end while still quiet,
        else the result (``sent`` or ``nothing_unread``; ``no_registration`` when
        something is unread but the person has no active registration left)."""
        # Locked: a change of the settings committing meanwhile would find this job
        # running (not movable) and could make the person quiet again unseen.
        doc = quiet_store.doc_of(conn, user_id, lock=True)
        if doc is not None:
            end = quiet_until(quiet_from_doc(doc), now)
            if end is not None:
                return end
        held = quiet_store.take_held(conn, user_id)
        reach = facts.reach_now(conn, {(user_id, t) for t, _seq in held if t is not None})

        def position(thread_id: str | None) -> int | None:
            found = reach.get((user_id, thread_id))
            return found.read_position if found is not None and found.allowed else None

        count = summary_count((t, seq, position(t)) for t, seq in held)
        result = decide_summary(count)
        if count > 0:
            targets = quiet_store.summary_targets(conn, user_id)
            if not targets:
                return SkipReason.NO_REGISTRATION
            writer = JobWriter(conn, now)
            nid = new_id()
            for registration_id in targets:
                args = PushSummaryArgs(user_id, registration_id, count, nid)
                writer.add(JobSpec(PUSH_SUMMARY, args.to_args(), now, self._max_attempts))
            writer.finish()
        return result


_SOON = timedelta(seconds=1)
"""The least a still-quiet summary waits (its end is a wall-clock minute)."""


@fast_init
@dataclass(frozen=True, slots=True)
class SummarySend:
    """A summary push planned: its args, where it goes, the badge it carries."""

    args: PushSummaryArgs
    target: Target
    badge: int | None = None


class SummaryPush(PushKind[PushSummaryArgs, SummarySend]):
    """``notify.push_summary``: one summary push to one registration;
    ``urgency_of`` gives the ``summary`` kind's urgency (``low`` by default)."""

    kind = PUSH_SUMMARY
    plan_writes = False

    def __init__(
        self, *, config: PushConfig, urgency_of: Callable[[str], str] = DEFAULT_NOTIFY.urgency_of
    ) -> None:
        self._config = config
        self._urgency = str(urgency_of("summary"))

    def parse(self, args: Mapping[str, Any]) -> PushSummaryArgs | None:
        return PushSummaryArgs.parse(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, PushSummaryArgs]], now: datetime
    ) -> dict[int, SummarySend | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for _job, a in claimed})
        found_badges = badges(conn, self._config, {a.user_id for _job, a in claimed})
        plans: dict[int, SummarySend | SkipReason | Done] = {}
        for job, a in claimed:
            found = still_active(loaded.get(a.registration_id), a.user_id)
            if found is None:
                plans[job.id] = SkipReason.NO_REGISTRATION
            else:
                target = target_of(found[0], found[1], job)
                plans[job.id] = SummarySend(a, target, badge_of(found_badges, a.user_id))
        return plans

    def message(self, plan: SummarySend) -> SummaryMessage:
        return SummaryMessage(plan.args.nid, plan.args.count, plan.badge, self._urgency)
