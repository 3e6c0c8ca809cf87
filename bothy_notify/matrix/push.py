"""``matrix.push_send``: one push of the Matrix gateway to one pushkey's registration.

A :class:`~bothy_notify.push.jobs.PushKind` (:class:`MatrixPush`) run by the one
push handler with the registrations' lifecycle
(:class:`~bothy_notify.notify.jobs.registration_push.RegistrationLifecycle`): the
same providers, permits, outcomes, strikes and invalidation as every push to a
registration. The gateway (:mod:`.gateway`) writes one such job per (event,
pushkey), unique on the pair; its args are IDs and integers only
(:class:`MatrixPushArgs`). The checks, for the whole claimed batch in one
statement:

1. The registration still exists and is active: else skip ``no_registration``
   (its pushkey was declared gone meanwhile; the gateway lists it in
   ``rejected``).
2. The job is younger than ``push.max_age`` (from its insert): else
   ``skipped_expired``, nothing sent (a hint that late tells nothing).

Then :class:`~bothy_notify.push.port.MatrixMessage`: ``event_id``, ``room_id``,
``unread`` (also the badge), ``missed_calls`` and the urgency, never content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bothy_notify.config import PushConfig
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.notify.jobs.registration_push import target_of
from bothy_notify.push.jobs import PushKind
from bothy_notify.push.port import MatrixMessage, Target
from bothy_notify.runner import Done
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Conn
from bothy_notify.store.jobs import Job

KIND = "matrix.push_send"
"""The job kind of a gateway push."""
URGENCIES = frozenset({"high", "normal", "low"})


@dataclass(frozen=True, slots=True)
class MatrixPushArgs:
    """``matrix.push_send`` args: the pushkey's registration, the urgency (from the
    notification's ``prio``), and what the push carries (absent: not said)."""

    registration_id: str
    urgency: str
    event_id: str | None = None
    room_id: str | None = None
    unread: int | None = None
    missed_calls: int | None = None

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> MatrixPushArgs | None:
        """Stored args as a value; ``None`` when they are not what the gateway writes."""
        registration_id, urgency = args.get("registration_id"), args.get("urgency")
        if not isinstance(registration_id, str) or urgency not in URGENCIES:
            return None
        strings = [args.get("event_id"), args.get("room_id")]
        counts = [args.get("unread"), args.get("missed_calls")]
        if not all(v is None or isinstance(v, str) for v in strings):
            return None
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in counts):
            return None
        return cls(registration_id, str(urgency), *strings, *counts)

    def __repr__(self) -> str:
        return f"MatrixPushArgs(badge_only={self.event_id is None})"


@dataclass(frozen=True, slots=True)
class MatrixSend:
    """A gateway push planned: its args and where it goes."""

    args: MatrixPushArgs
    target: Target


class MatrixPush(PushKind[MatrixPushArgs, MatrixSend]):
    """``matrix.push_send``: the checks of the module docstring, a
    :class:`~bothy_notify.push.port.MatrixMessage`."""

    kind = KIND
    plan_writes = False

    def __init__(self, *, config: PushConfig) -> None:
        self._config = config

    def parse(self, args: Mapping[str, Any]) -> MatrixPushArgs | None:
        return MatrixPushArgs.parse(args)

    def plan(
        self, conn: Conn, claimed: Sequence[tuple[Job, MatrixPushArgs]], now: datetime
    ) -> dict[int, MatrixSend | SkipReason | Done]:
        loaded = regs.load(conn, {a.registration_id for _job, a in claimed})
        max_age = self._config.max_age
        plans: dict[int, MatrixSend | SkipReason | Done] = {}
        for job, a in claimed:
            found = loaded.get(a.registration_id)
            if found is None or found[0].invalidated_at is not None:
                plans[job.id] = SkipReason.NO_REGISTRATION
            elif now - job.created_at > max_age:
                plans[job.id] = Done(Result.SKIPPED_EXPIRED)
            else:
                reg, platform = found
                plans[job.id] = MatrixSend(a, target_of(reg, platform, job))
        return plans

    def message(self, plan: MatrixSend) -> MatrixMessage:
        a = plan.args
        return MatrixMessage(
            a.event_id,
            a.room_id,
            unread=a.unread,
            missed_calls=a.missed_calls,
            urgency=a.urgency,
        )
