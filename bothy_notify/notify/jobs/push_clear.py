"""``notify.push_clear``: one read push to one registration (clear-on-read).

Queued by a read that moved the person's position on a thread forward, for each
of their registrations marked for that thread (:mod:`bothy_notify.store.marks`),
``push.clear_delay`` after the read, at most one pending per (registration,
thread). Checks, in one transaction for the whole claimed batch:

1. The registration is still active and still the person's: else skip
   ``no_registration``.
2. The mark is still there (its pending flag is taken back here, so a read from
   now on queues another clear): else ``skipped_unmarked``, nothing sent.
3. The read position and the badge are read now (``badges_of``, one statement for
   the batch, unless ``push.badge = "off"``): a burst of reads sends the newest.

Then :class:`~bothy_notify.push.port.ReadMessage` ``{"kind":"read","thread_id",
"seq","badge"}`` (urgency ``low``) through the same send, outcomes, strikes and
lifecycle as ``notify.push_send`` (:class:`~.push_send.Sending`); a delivery
removes the mark in the commit of the job's result, unless a newer push marked it
again meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from bothy_notify.config import BadgeMode, NotifyConfig, PushConfig
from bothy_notify.kernel.clock import Clock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import PUSH_CLEAR, PushClearArgs
from bothy_notify.notify.jobs.push_send import Sending, still_active, target_of
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.port import ReadMessage, Target
from bothy_notify.push.registry import Providers
from bothy_notify.runner import BatchedEffect, Done, Report
from bothy_notify.store import marks
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn, Database
from bothy_notify.store.jobs import Job
from bothy_notify.store.unread import badges_of

UNMARKED = "skipped_unmarked"
"""The result of a clear whose mark is gone (cleared already, or its registration
deleted): nothing to clear."""


_DEFAULT_NOTIFY = NotifyConfig()
"""Where a handler built without ``urgency_of`` reads the ``read`` kind's default."""


@fast_init
@dataclass(frozen=True, slots=True)
class _Clear:
    args: PushClearArgs
    target: Target
    marked_at: datetime
    seq: int
    badge: int | None = None


class PushClearHandler:
    """Runs ``notify.push_clear`` jobs; ``urgency_of`` gives the ``read`` kind's
    urgency (``[notify.urgency]``, ``low`` by default)."""

    kind = PUSH_CLEAR

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
        self._grouping = grouping
        self._urgency = str(urgency_of("read"))
        self._clock = clock
        self._config = config
        self._metrics = metrics
        self.sending = Sending(providers=providers, config=config, metrics=metrics)

    def __repr__(self) -> str:
        return "PushClearHandler()"

    async def run_batch(self, jobs: Sequence[Job], report: Report) -> None:
        parsed = {job.id: PushClearArgs.from_args(job.args) for job in jobs}
        attempts = {job.id: (job.attempt, job.max_attempts) for job in jobs}
        plans = await self._db.run(lambda c: self._check(c, parsed, attempts))
        await self.sending.run_plans(jobs, plans, report, self._send)

    def _check(
        self,
        conn: Conn,
        parsed: dict[int, PushClearArgs],
        attempts: dict[int, tuple[int, int]],
    ) -> dict[int, _Clear | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for a in parsed.values()})
        marked = marks.take_pending(
            conn, {(a.registration_id, a.thread_id) for a in parsed.values()}
        )
        positions = marks.read_positions(conn, {(a.user_id, a.thread_id) for a in parsed.values()})
        plans: dict[int, _Clear | SkipReason | Done] = {}
        for job_id, a in parsed.items():
            found = still_active(loaded.get(a.registration_id), a.user_id)
            if found is None:
                plans[job_id] = SkipReason.NO_REGISTRATION
                continue
            marked_at = marked.get((a.registration_id, a.thread_id))
            if marked_at is None:
                plans[job_id] = Done(UNMARKED)
                continue
            reg, platform = found
            plans[job_id] = _Clear(
                a,
                target_of(reg, platform, attempts[job_id]),
                marked_at,
                positions.get((a.user_id, a.thread_id), 0),
            )
        if self._config.badge is BadgeMode.UNREAD_THREADS:
            sending = {p.args.user_id for p in plans.values() if isinstance(p, _Clear)}
            badges = badges_of(conn, sending)
            for job_id, plan in plans.items():
                if isinstance(plan, _Clear):
                    plans[job_id] = _Clear(
                        plan.args,
                        plan.target,
                        plan.marked_at,
                        plan.seq,
                        badges.get(plan.args.user_id, 0),
                    )
        return plans

    async def _send(self, job: Job, plan: _Clear, report: Report) -> None:
        thread_id = plan.args.thread_id
        group = self._grouping.of(thread_id) if self._grouping is not None else None
        message = ReadMessage(thread_id, plan.seq, plan.badge, self._urgency, group)
        outcome = await self.sending.send(job, plan.target, message, report)
        if outcome is None:
            return
        target = plan.target
        delivered = BatchedEffect(
            delivered_unmarked,
            (target.registration_id, target.provider, plan.args.thread_id, plan.marked_at),
        )
        await report(job, self.sending.result_for(job, target, outcome, delivered))


def delivered_unmarked(
    conn: Conn, items: list[tuple[str, str, str, datetime]], now: datetime
) -> None:
    """Deliveries of read pushes: the lifecycle's effect, and each mark removed."""
    regs.mark_delivered_many(conn, [(r, p) for r, p, _t, _at in items], now)
    marks.remove_many(conn, [(r, t, at) for r, _p, t, at in items])
