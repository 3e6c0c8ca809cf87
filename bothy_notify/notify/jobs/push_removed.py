"""``notify.push_removed``: one push to one registration after messages of a thread
were deleted (``message.deleted``, issue 33).

Queued by the deletion (:func:`bothy_notify.store.marks.queue_removals`) for each
active registration marked for the thread (pushed for it since its last clear),
whoever's, ``push.clear_delay`` later, at most one pending per (registration,
thread): a burst of deletions sends one push. A
:class:`~bothy_notify.push.jobs.PushKind` (:class:`RemovedPush`); its checks, in
one transaction for the whole claimed batch:

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
default) through the one push handler: the same send, outcomes, strikes and
lifecycle as every push to a registration (:mod:`.registration_push`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.results import Result
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify import facts
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import PUSH_REMOVED, PushRemovedArgs
from bothy_notify.notify.jobs.push_clear import delivered_unmarked
from bothy_notify.notify.jobs.registration_push import (
    DEFAULT_NOTIFY,
    badge_of,
    badges,
    still_active,
    target_of,
)
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import ReadMessage, RemovedMessage, Target
from bothy_notify.runner import BatchedEffect, Done
from bothy_notify.store import deletions, marks
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job


@fast_init
@dataclass(frozen=True, slots=True)
class RemovedSend:
    """A planned push: where it goes, the mark, and what it says: ``message_id`` of
    the latest deletion, or ``None`` for the read clear at ``seq``."""

    args: PushRemovedArgs
    target: Target
    marked_at: datetime
    seq: int
    message_id: str | None
    badge: int | None = None


class RemovedPush(PushKind[PushRemovedArgs, RemovedSend]):
    """``notify.push_removed``; ``urgency_of`` gives the ``removed`` and ``read``
    kinds' urgency (``[notify.urgency]``, ``low`` by default); ``grouping`` the
    thread's grouping value (:mod:`bothy_notify.push.grouping`)."""

    kind = PUSH_REMOVED
    plan_writes = True  # the mark's removed_pending flag is taken back

    def __init__(
        self,
        *,
        config: PushConfig,
        urgency_of: Callable[[str], str] = DEFAULT_NOTIFY.urgency_of,
        grouping: ThreadGrouping | None = None,
    ) -> None:
        self._config = config
        self._removed_urgency = str(urgency_of("removed"))
        self._read_urgency = str(urgency_of("read"))
        self._grouping = grouping

    def parse(self, args: Mapping[str, Any]) -> PushRemovedArgs | None:
        return PushRemovedArgs.parse(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, PushRemovedArgs]], now: datetime
    ) -> dict[int, RemovedSend | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for _job, a in claimed})
        marked = marks.take_removed_pending(
            conn, {(a.registration_id, a.thread_id) for _job, a in claimed}
        )
        plans: dict[int, RemovedSend | SkipReason | Done] = {}
        passed = []
        for job, a in claimed:
            found = still_active(loaded.get(a.registration_id), a.user_id)
            marked_at = marked.get((a.registration_id, a.thread_id))
            if found is None:
                plans[job.id] = SkipReason.NO_REGISTRATION
            elif marked_at is None:
                plans[job.id] = Done(Result.SKIPPED_UNMARKED)
            else:
                passed.append((job, a, found, marked_at))
        if not passed:
            return plans
        thread_ids = {a.thread_id for _job, a, _f, _m in passed}
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for _job, a, _f, _m in passed})
        infos = facts.threads(conn, thread_ids)
        newest = deletions.newest_deleted(conn, thread_ids)
        found_badges = badges(conn, self._config, {a.user_id for _job, a, _f, _m in passed})
        for job, a, (reg, platform), marked_at in passed:
            info = infos.get(a.thread_id)
            position = reach[(a.user_id, a.thread_id)].read_position
            last = info.last_message_seq if info is not None else 0
            deleted = newest.get(a.thread_id)
            # Nothing of the thread left unread (or no deletion kept): the read clear.
            message_id = deleted if position < last and deleted is not None else None
            plans[job.id] = RemovedSend(
                a,
                target_of(reg, platform, job),
                marked_at,
                position,
                message_id,
                badge_of(found_badges, a.user_id),
            )
        return plans

    def message(self, plan: RemovedSend) -> ReadMessage | RemovedMessage:
        thread_id = plan.args.thread_id
        group = self._grouping.of(thread_id) if self._grouping is not None else None
        if plan.message_id is None:
            return ReadMessage(thread_id, plan.seq, plan.badge, self._read_urgency, group)
        return RemovedMessage(thread_id, plan.message_id, plan.badge, self._removed_urgency, group)

    def delivered(self, plan: RemovedSend) -> BatchedEffect | None:
        """A delivered read clear removes its mark (unless a newer push marked it
        again); a removed push leaves it (the phone may still show the thread)."""
        if plan.message_id is not None:
            return None
        target = plan.target
        return BatchedEffect(
            delivered_unmarked,
            (target.registration_id, target.provider, plan.args.thread_id, plan.marked_at),
        )
