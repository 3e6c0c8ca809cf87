"""``notify.push_removed``: one push to one registration after messages of a thread
were deleted (``message.deleted``, issue 33).

Queued by the deletion (:func:`bothy_notify.store.marks.queue_removals`) for each
active registration marked for the thread (pushed for it since its last clear),
whoever's, ``push.clear_delay`` later, at most one pending per (registration,
thread): a burst of deletions sends one push. Checks, in one transaction for the
whole claimed batch:

1. The registration is still active and still the person's: else skip
   ``no_registration``.
2. The mark is still there (its ``removed_pending`` flag is taken back here, so a
   deletion from now on queues another): else ``skipped_unmarked``, nothing sent
   (a read cleared the phone meanwhile).
3. The person's read position, the thread's last message and newest deletion, and
   the badge are read now (one statement each for the batch): nothing of the
   thread left unread (the position at or past its last message, which
   ``last_seq`` may have moved back) sends the ``read`` clear
   (:class:`~bothy_notify.push.port.ReadMessage`, whose delivery removes the mark
   as a clear's does); otherwise :class:`~bothy_notify.push.port.RemovedMessage`
   ``{"kind":"removed","thread_id","message_id","badge"}`` naming the thread's
   latest deletion, and the mark stays (the phone may still show the thread).

Both are background pushes (urgency ``read``'s and ``removed``'s, ``low`` by
default) through the same send, outcomes, strikes and lifecycle as every push to
a registration (:class:`~.push_send.Sending`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from bothy_notify.config import BadgeMode, NotifyConfig, PushConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify import facts
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import PUSH_REMOVED, PushRemovedArgs
from bothy_notify.notify.jobs.push_clear import UNMARKED, delivered_unmarked
from bothy_notify.notify.jobs.push_send import Sending, still_active, target_of
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.port import ReadMessage, RemovedMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import BatchedEffect, Done, Report
from bothy_notify.store import deletions, marks
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job
from bothy_notify.store.unread import badges_of

_DEFAULT_NOTIFY = NotifyConfig()
"""Where a handler built without ``urgency_of`` reads the kinds' default urgency."""


@fast_init
@dataclass(frozen=True, slots=True)
class _Removal:
    """A planned push: where it goes, the mark, and what it says: ``message_id`` of
    the latest deletion, or ``None`` for the read clear at ``seq``."""

    args: PushRemovedArgs
    target: Target
    marked_at: datetime
    seq: int
    message_id: str | None
    badge: int | None = None


class PushRemovedHandler:
    """Runs ``notify.push_removed`` jobs; ``urgency_of`` gives the ``removed`` and
    ``read`` kinds' urgency (``[notify.urgency]``, ``low`` by default);
    ``grouping`` the thread's grouping value (:mod:`bothy_notify.push.grouping`)."""

    kind = PUSH_REMOVED

    def __init__(
        self,
        *,
        db: Database,
        providers: Providers,
        clock: Clock,
        config: PushConfig,
        metrics: Metrics,
        urgency_of: Callable[[str], str] = _DEFAULT_NOTIFY.urgency_of,
        grouping: ThreadGrouping | None = None,
    ) -> None:
        self._db = db
        self._removed_urgency = str(urgency_of("removed"))
        self._read_urgency = str(urgency_of("read"))
        self._clock = clock
        self._config = config
        self._grouping = grouping
        self.sending = Sending(providers=providers, config=config, metrics=metrics)

    def __repr__(self) -> str:
        return "PushRemovedHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        parsed = {job.id: PushRemovedArgs.from_args(job.args) for job in jobs}
        attempts = {job.id: (job.attempt, job.max_attempts) for job in jobs}
        plans = await self._db.run(lambda c: self._check(c, parsed, attempts))
        await self.sending.run_plans(jobs, plans, report, self._send)

    def _check(
        self,
        conn: Conn,
        parsed: dict[int, PushRemovedArgs],
        attempts: dict[int, tuple[int, int]],
    ) -> dict[int, _Removal | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for a in parsed.values()})
        marked = marks.take_removed_pending(
            conn, {(a.registration_id, a.thread_id) for a in parsed.values()}
        )
        thread_ids = {a.thread_id for a in parsed.values()}
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for a in parsed.values()})
        infos = facts.threads(conn, thread_ids)
        newest = deletions.newest_deleted(conn, thread_ids)
        plans: dict[int, _Removal | SkipReason | Done] = {}
        for job_id, a in parsed.items():
            found = still_active(loaded.get(a.registration_id), a.user_id)
            if found is None:
                plans[job_id] = SkipReason.NO_REGISTRATION
                continue
            marked_at = marked.get((a.registration_id, a.thread_id))
            if marked_at is None:
                plans[job_id] = Done(UNMARKED)
                continue
            info = infos.get(a.thread_id)
            position = reach[(a.user_id, a.thread_id)].read_position
            last = info.last_message_seq if info is not None else 0
            deleted = newest.get(a.thread_id)
            # Nothing of the thread left unread (or no deletion kept): the read clear.
            message_id = deleted if position < last and deleted is not None else None
            reg, platform = found
            plans[job_id] = _Removal(
                a, target_of(reg, platform, attempts[job_id]), marked_at, position, message_id
            )
        if self._config.badge is BadgeMode.UNREAD_THREADS:
            sending = {p.args.user_id for p in plans.values() if isinstance(p, _Removal)}
            badges = badges_of(conn, sending)
            for job_id, plan in plans.items():
                if isinstance(plan, _Removal):
                    plans[job_id] = _Removal(
                        plan.args,
                        plan.target,
                        plan.marked_at,
                        plan.seq,
                        plan.message_id,
                        badges.get(plan.args.user_id, 0),
                    )
        return plans

    async def _send(self, job: Job, plan: _Removal, report: Report) -> None:
        thread_id = plan.args.thread_id
        group = self._grouping.of(thread_id) if self._grouping is not None else None
        message: ReadMessage | RemovedMessage
        if plan.message_id is None:
            message = ReadMessage(thread_id, plan.seq, plan.badge, self._read_urgency, group)
        else:
            message = RemovedMessage(
                thread_id, plan.message_id, plan.badge, self._removed_urgency, group
            )
        outcome = await self.sending.send(job, plan.target, message, report)
        if outcome is None:
            return
        target = plan.target
        delivered = None
        if plan.message_id is None:  # a read clear: its delivery removes the mark
            delivered = BatchedEffect(
                delivered_unmarked,
                (target.registration_id, target.provider, thread_id, plan.marked_at),
            )
        await report(job, self.sending.result_for(job, target, outcome, delivered))
