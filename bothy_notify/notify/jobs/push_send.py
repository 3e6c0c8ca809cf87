"""``notify.push_send``: one hint pushed to one registration.

A :class:`~bothy_notify.push.jobs.PushKind` (:class:`HintPush`): the send, its
outcomes, retries and the token lifecycle are the one push handler's
(:mod:`bothy_notify.push.jobs`, :mod:`.registration_push`). Its checks, in one
database call for the whole claimed batch (SPEC section 7):

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

A delivered hint about a thread also marks (registration, thread) in the commit
of the job's result, for clear-on-read (:mod:`bothy_notify.store.marks`,
:mod:`bothy_notify.notify.jobs.push_clear`). Its latency is observed as route
``push`` (``push_delayed`` for a delayed push).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.clock import from_unix_micros
from bothy_notify.kernel.metrics import Children, Metrics
from bothy_notify.kernel.results import Result
from bothy_notify.kernel.values import fast_init
from bothy_notify.notify import facts
from bothy_notify.notify.catalogue import Catalogue
from bothy_notify.notify.domain import SkipReason, release_delayed
from bothy_notify.notify.domain.quiet import hold_until
from bothy_notify.notify.jobs.args import PUSH_SEND, PushSendArgs
from bothy_notify.notify.jobs.registration_push import (
    DEFAULT_NOTIFY,
    badge_of,
    badges,
    still_active,
    target_of,
)
from bothy_notify.push.grouping import ThreadGrouping
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import PushMessage, Target
from bothy_notify.runner import BatchedEffect, Done
from bothy_notify.store import deletions, marks
from bothy_notify.store import quiet as quiet_store
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job

_BUILTIN_CATALOGUE = Catalogue.builtin()
"""Where a kind built without ``category_of`` finds a kind's category."""


@fast_init
@dataclass(frozen=True, slots=True)
class HintSend:
    """A hint push planned: its args, where it goes, the badge it carries."""

    args: PushSendArgs
    target: Target
    badge: int | None = None


def hint_age_exceeded(due_at_micros: int, now: datetime, config: PushConfig) -> bool:
    """Whether a hint decided at ``due_at_micros`` is older than ``push.max_age`` now."""
    return now - from_unix_micros(due_at_micros) > config.max_age


class HintPush(PushKind[PushSendArgs, HintSend]):
    """``notify.push_send``: the checks above, a :class:`~.port.PushMessage`.

    ``mv`` is the catalogue version the job carries (fixed when the hint was
    decided); ``catalogue_version`` gives it for a job queued without one.
    ``urgency_of`` gives a kind's urgency (``[notify.urgency]``). The category a
    quiet-hours hold goes by is the job's own (the recipient's, fixed when
    decided: an app hint names its own); ``category_of`` gives it, from the kind
    catalogue, for a job queued without one. ``grouping`` gives a thread's grouping
    value (:mod:`bothy_notify.push.grouping`); ``None``: pushes carry none.
    """

    kind = PUSH_SEND
    # Each read is its own statement: under READ COMMITTED a transaction would give
    # them no common snapshot either, only BEGIN and COMMIT round trips.
    plan_writes = False

    def __init__(
        self,
        *,
        config: PushConfig,
        metrics: Metrics,
        catalogue_version: Callable[[], str | None] = lambda: None,
        urgency_of: Callable[[str], str] = DEFAULT_NOTIFY.urgency_of,
        category_of: Callable[[str], str] = _BUILTIN_CATALOGUE.category_of,
        grouping: ThreadGrouping | None = None,
    ) -> None:
        self._config = config
        self._grouping = grouping
        self._held = Children(metrics.push_held)
        self._mv = catalogue_version
        self._urgency_of = urgency_of
        self._category_of = category_of

    def parse(self, args: Mapping[str, Any]) -> PushSendArgs | None:
        return PushSendArgs.parse(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, PushSendArgs]], now: datetime
    ) -> dict[int, HintSend | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for _job, a in claimed})
        reach = facts.reach_now(conn, {(a.user_id, a.thread_id) for _job, a in claimed})
        plans: dict[int, HintSend | SkipReason | Done] = {}
        passed: list[tuple[Job, PushSendArgs, tuple[regs.Registration, str]]] = []
        maybe_deleted: dict[int, tuple[str, str]] = {}
        for job, a in claimed:
            found = still_active(loaded.get(a.registration_id), a.user_id)
            if found is None:
                plans[job.id] = SkipReason.NO_REGISTRATION
            elif hint_age_exceeded(a.due_at, now, self._config):
                plans[job.id] = SkipReason.EXPIRED
            elif not (now_reach := reach[(a.user_id, a.thread_id)]).allowed:
                plans[job.id] = SkipReason.NO_ACCESS
            # The release check reads only the read position, and only for a delayed push.
            elif a.release_seq > 0 and not release_delayed(a.release_seq, now_reach.read_position):
                plans[job.id] = SkipReason.READ
            else:
                if now_reach.deletions and a.thread_id is not None and a.message_id is not None:
                    maybe_deleted[job.id] = (a.thread_id, a.message_id)
                passed.append((job, a, found))
        if maybe_deleted:  # only in a thread with a recent deletion
            gone = deletions.deleted_among(conn, set(maybe_deleted.values()))
            if gone:
                dropped = {job_id for job_id, key in maybe_deleted.items() if key in gone}
                for job_id in dropped:
                    plans[job_id] = SkipReason.DELETED
                passed = [item for item in passed if item[0].id not in dropped]
        sending = self._hold_quiet(conn, passed, plans, now)
        found_badges = badges(conn, self._config, {a.user_id for _job, a, _found in sending})
        for job, a, (reg, platform) in sending:
            plans[job.id] = HintSend(
                a, target_of(reg, platform, job), badge_of(found_badges, a.user_id)
            )
        return plans

    def _hold_quiet(
        self,
        conn: Conn,
        passed: list[tuple[Job, PushSendArgs, tuple[regs.Registration, str]]],
        plans: dict[int, HintSend | SkipReason | Done],
        now: datetime,
    ) -> list[tuple[Job, PushSendArgs, tuple[regs.Registration, str]]]:
        """Hold the pushes of people in quiet hours (step 5); the others, to send."""
        docs = quiet_store.docs_of(conn, {a.user_id for _job, a, _found in passed})
        if not docs:
            return passed
        sending = []
        ends: dict[tuple[str, str], datetime | None] = {}  # once per person and category
        for item in passed:
            job, a, _found = item
            if a.user_id in docs:
                category = a.category or self._category_of(a.kind)
                key = (a.user_id, category)
                if key not in ends:
                    ends[key] = hold_until(facts.hours_of(docs[a.user_id]), category, now)
                ends_at = ends[key]
                if ends_at is not None:
                    self._held(category).inc()
                    held = quiet_store.Held(a.user_id, a.thread_id, a.nid, category, ends_at)
                    plans[job.id] = Done(Result.HELD, BatchedEffect(quiet_store.hold_many, held))
                    continue
            sending.append(item)
        return sending

    def message(self, plan: HintSend) -> PushMessage:
        a = plan.args
        return PushMessage(
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

    def delivered(self, plan: HintSend) -> BatchedEffect | None:
        """A delivered hint about a thread also marks the registration for clear-on-read."""
        if plan.args.thread_id is None:
            return None
        target = plan.target
        return BatchedEffect(
            _delivered_marked, (target.registration_id, target.provider, plan.args.thread_id)
        )

    def route(self, plan: HintSend) -> tuple[str, int]:
        a = plan.args
        return ("push_delayed" if a.release_seq > 0 else "push", a.appended_at)


def _delivered_marked(conn: Conn, items: list[tuple[str, str, str]], now: datetime) -> None:
    """Deliveries of hints about threads: the lifecycle's effect, and each
    (registration, thread) marked for clear-on-read (:mod:`bothy_notify.store.marks`)."""
    regs.mark_delivered_many(conn, [(r, p) for r, p, _t in items], now)
    marks.record_many(conn, [(r, t) for r, _p, t in items], now)
