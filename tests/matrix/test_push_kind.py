"""``matrix.push_send`` as a push kind: its args as the gateway writes them, and its
plan against stored registrations (active: sent; invalidated: skipped
``no_registration``; older than ``push.max_age``: ``skipped_expired``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bothy_notify.config import PushConfig
from bothy_notify.kernel.results import Result, SkipReason
from bothy_notify.matrix.push import KIND, MatrixPush, MatrixPushArgs, MatrixSend
from bothy_notify.push.port import MatrixMessage
from bothy_notify.runner import Done
from bothy_notify.store import registrations as regs
from bothy_notify.store.db import Database
from bothy_notify.store.jobs import Job
from bothy_notify.store.matrix import Pushkey, pushkeys

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
OWNER = "matrix-gateway/im.example.ios"
EVENT = "$3957tyerfgewrf384:example.org"
ROOM = "!slw48wfj34rtnrf:example.org"


def job(job_id: int, args: MatrixPushArgs, *, created_at: datetime = NOW) -> Job:
    return Job(
        id=job_id,
        kind=KIND,
        args={"registration_id": args.registration_id, "urgency": args.urgency},
        attempt=1,
        max_attempts=3,
        scheduled_at=created_at,
        created_at=created_at,
    )


def test_args_are_read_as_the_gateway_writes_them() -> None:
    stored = {
        "registration_id": "r1",
        "urgency": "normal",
        "event_id": EVENT,
        "room_id": ROOM,
        "unread": 2,
        "missed_calls": 0,
    }
    assert MatrixPushArgs.parse(stored) == MatrixPushArgs("r1", "normal", EVENT, ROOM, 2, 0)
    badge_only = {"registration_id": "r1", "urgency": "low", "unread": 0}
    assert MatrixPushArgs.parse(badge_only) == MatrixPushArgs("r1", "low", unread=0)
    assert EVENT not in repr(MatrixPushArgs.parse(stored))


@pytest.mark.parametrize(
    "broken",
    [
        {"urgency": "normal"},
        {"registration_id": "r1"},
        {"registration_id": "r1", "urgency": "urgent"},
        {"registration_id": 7, "urgency": "normal"},
        {"registration_id": "r1", "urgency": "normal", "unread": "2"},
        {"registration_id": "r1", "urgency": "normal", "unread": True},
        {"registration_id": "r1", "urgency": "normal", "event_id": 5},
    ],
)
def test_args_the_gateway_never_writes_are_malformed(broken: dict[str, object]) -> None:
    assert MatrixPushArgs.parse(broken) is None


async def test_the_plan_sends_to_active_registrations_only_and_not_too_late(
    db: Database,
) -> None:
    found = [
        Pushkey(OWNER, "im.example.ios", "apns", token, environment="production")
        for token in ("ab" * 32, "cd" * 32)
    ]
    active, dead = await db.run(lambda c: pushkeys(c, found, NOW, renew_after=timedelta(days=1)))
    await db.run(lambda c: regs.mark_dead(c, dead.registration_id, "Unregistered", NOW))
    config = PushConfig()
    push = MatrixPush(config=config)
    sent = MatrixPushArgs(active.registration_id, "normal", EVENT, ROOM, 3, 1)
    late = MatrixPushArgs(active.registration_id, "normal", EVENT, ROOM, 3, 1)
    gone = MatrixPushArgs(dead.registration_id, "normal", EVENT, ROOM, 3, 1)
    claimed = [
        (job(1, sent), sent),
        (job(2, late, created_at=NOW - config.max_age - timedelta(seconds=1)), late),
        (job(3, gone), gone),
    ]
    plans = await db.run(lambda c: push.plan(c, claimed, NOW + timedelta(seconds=1)))

    planned = plans[1]
    assert isinstance(planned, MatrixSend)
    assert planned.target.registration_id == active.registration_id
    assert planned.target.provider == "apns"
    assert planned.target.token == "ab" * 32
    assert plans[2] == Done(Result.SKIPPED_EXPIRED)
    assert plans[3] is SkipReason.NO_REGISTRATION

    message = push.message(planned)
    assert message == MatrixMessage(EVENT, ROOM, unread=3, missed_calls=1, urgency="normal")
    assert message.payload() == {
        "event_id": EVENT,
        "room_id": ROOM,
        "unread": 3,
        "missed_calls": 1,
        "urgency": "normal",
    }
