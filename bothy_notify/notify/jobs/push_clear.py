"""``notify.push_clear``: one read push to one registration (clear-on-read).

Queued by a read that moved the person's position on a thread forward, for each
of their registrations marked for that thread (:mod:`bothy_notify.store.marks`),
``push.clear_delay`` after the read, at most one pending per (registration,
thread). A :class:`~bothy_notify.push.jobs.PushKind` (:class:`ReadClearPush`);
its checks, in one transaction for the whole claimed batch:

1. The registration is still active and still the person's: else skip
   ``no_registration``.
2. The mark is still there (its pending flag is taken back here, so a read from
   now on queues another clear): else ``skipped_unmarked``, nothing sent.
3. The read position and the badge are read now (``badges_of``, one statement for
   the batch, unless ``push.badge = "off"``): a burst of reads sends the newest.

Then :class:`~bothy_notify.push.port.ReadMessage` ``{"kind":"read","thread_id",
"seq","badge"}`` (urgency ``low``) through the one push handler: the same send,
outcomes, strikes and lifecycle as every push to a registration. A delivery
removes the mark in the commit of the job's result, unless a newer push marked it
again meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.results import Result
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify.domain import SkipReason
from bothy_notify.notify.jobs.args import PUSH_CLEAR, PushClearArgs
from bothy_notify.notify.jobs.registration_push import (
    DEFAULT_NOTIFY,
    badge_of,
    badges,
    still_active,
    target_of,
)
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import ReadMessage, Target
from bothy_notify.runner import BatchedEffect, Done
from bothy_notify.store import marks
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job


@fast_init
@dataclass(frozen=True, slots=True)
class ClearSend:
    """A read clear planned: where it goes, the mark it clears, the read position."""

    args: PushClearArgs
    target: Target
    marked_at: datetime
    seq: int
    badge: int | None = None


class ReadClearPush(PushKind[PushClearArgs, ClearSend]):
    """``notify.push_clear``; ``urgency_of`` gives the ``read`` kind's urgency
    (``[notify.urgency]``, ``low`` by default); ``grouping`` the thread's grouping
    value (:mod:`bothy_notify.push.grouping`)."""

    kind = PUSH_CLEAR
    plan_writes = True  # the mark's pending flag is taken back

    def __init__(
        self,
        *,
        config: PushConfig,
        urgency_of: Callable[[str], str] = DEFAULT_NOTIFY.urgency_of,
        grouping: ThreadGrouping | None = None,
    ) -> None:
        self._config = config
        self._grouping = grouping
        self._urgency = str(urgency_of("read"))

    def parse(self, args: Mapping[str, Any]) -> PushClearArgs | None:
        return PushClearArgs.parse(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, PushClearArgs]], now: datetime
    ) -> dict[int, ClearSend | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for _job, a in claimed})
        marked = marks.take_pending(conn, {(a.registration_id, a.thread_id) for _job, a in claimed})
        positions = marks.read_positions(conn, {(a.user_id, a.thread_id) for _job, a in claimed})
        plans: dict[int, ClearSend | SkipReason | Done] = {}
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
        found_badges = badges(conn, self._config, {a.user_id for _job, a, _f, _m in passed})
        for job, a, (reg, platform), marked_at in passed:
            plans[job.id] = ClearSend(
                a,
                target_of(reg, platform, job),
                marked_at,
                positions.get((a.user_id, a.thread_id), 0),
                badge_of(found_badges, a.user_id),
            )
        return plans

    def message(self, plan: ClearSend) -> ReadMessage:
        thread_id = plan.args.thread_id
        group = self._grouping.of(thread_id) if self._grouping is not None else None
        return ReadMessage(thread_id, plan.seq, plan.badge, self._urgency, group)

    def delivered(self, plan: ClearSend) -> BatchedEffect:
        """A delivered clear removes its mark (unless a newer push marked it again)."""
        target = plan.target
        return BatchedEffect(
            delivered_unmarked,
            (target.registration_id, target.provider, plan.args.thread_id, plan.marked_at),
        )


def delivered_unmarked(
    conn: Conn, items: list[tuple[str, str, str, datetime]], now: datetime
) -> None:
    """Deliveries of read pushes: the lifecycle's effect, and each mark removed."""
    regs.mark_delivered_many(conn, [(r, p) for r, p, _t, _at in items], now)
    marks.remove_many(conn, [(r, t, at) for r, _p, t, at in items])
