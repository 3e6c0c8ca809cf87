"""HintJobs writes a delivery's jobs: immediate pushes encoded once per hint hold exactly
the args push_jobs builds; gateway and delayed routes go through the live routes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bothy_notify.kernel.clock import to_unix_micros
from bothy_notify.notify.domain import Delivery, Hint, Route, Via
from bothy_notify.notify.jobs.args import PUSH_SEND, PushSendArgs
from bothy_notify.notify.routes import FailClosedRoutes, HintJobs, JobLiveRoutes, push_jobs
from bothy_notify.store.jobs import JobSpec, JobWriter
from tests.job_args import assert_ids_and_integers

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
APPENDED = NOW - timedelta(milliseconds=40)

HINTS = [
    Hint(
        nid="n-1", kind="message", category="messages", thread_id="t1", message_id="m1",
        message_seq=3, actor_id="sam",
    ),
    Hint(
        nid="n-2", kind="message", category="messages", thread_id="t1", message_id="m2",
        message_seq=4, mv="0123456789abcdef",
    ),
    Hint(nid="n-3", kind="security", category="security", target_id="dev-2"),
    Hint(nid="n-4", kind="acme/chat:invite", category="social", thread_id="t9", target_id="x"),
]  # fmt: skip


def stored(url: str) -> list[tuple[str, dict[str, Any], datetime, int, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT kind, args, scheduled_at, max_attempts, unique_key FROM bothy.jobs ORDER BY id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def write(url: str, hint: Hint, delivery: Delivery, live: Any = None) -> int:
    with psycopg.connect(url) as conn:
        writer = JobWriter(conn, NOW)
        jobs = HintJobs(
            hint,
            live or FailClosedRoutes(),
            writer,
            now=NOW,
            appended_at=APPENDED,
            push_max_attempts=7,
            encoded={},
        )
        with writer.stream():
            added = jobs.add(delivery)
        writer.finish()
        conn.commit()
    return added


@pytest.mark.parametrize("hint", HINTS, ids=lambda h: h.nid)
@pytest.mark.parametrize(("kind", "count", "quiet"), [("message", 3, False), ("mention", 1, True)])
def test_immediate_pushes_hold_exactly_the_args_push_jobs_builds(
    database_url: str, hint: Hint, kind: str, count: int, quiet: bool
) -> None:
    route = Route(Via.PUSH, "tablet", ("reg-1", "reg-2"))
    delivery = Delivery("alex", kind, "messages", count, quiet, (route,))

    assert write(database_url, hint, delivery) == 2

    expected = push_jobs(
        hint,
        delivery,
        route,
        scheduled_at=NOW,
        release_seq=0,
        appended_at=APPENDED,
        max_attempts=7,
    )
    assert stored(database_url) == [(PUSH_SEND, dict(s.args), NOW, 7, None) for s in expected]
    for _kind, args, *_ in stored(database_url):
        assert_ids_and_integers(args)
        assert PushSendArgs.from_args(args).to_args() == args


def test_every_route_of_a_delivery_becomes_its_jobs_in_order(database_url: str) -> None:
    hint = HINTS[0]
    live = JobLiveRoutes(push_max_attempts=7)
    delayed = Route(Via.PUSH_DELAYED, "phone", ("reg-phone",), timedelta(minutes=2))
    delivery = Delivery(
        "alex",
        "message",
        "messages",
        1,
        False,
        (Route(Via.GATEWAY, "desk"), Route(Via.GATEWAY, "laptop"), delayed),
    )

    assert write(database_url, hint, delivery, live) == 2

    (gateway,) = live.gateway(hint, delivery, now=NOW, appended_at=APPENDED)
    (push,) = live.delayed(hint, delivery, delayed, now=NOW, appended_at=APPENDED)
    rows = stored(database_url)
    assert sorted(rows, key=lambda r: r[0]) == [
        (gateway.kind, dict(gateway.args), NOW, gateway.max_attempts, gateway.unique_key),
        (push.kind, dict(push.args), NOW + timedelta(minutes=2), 7, None),
    ]
    assert push.args["release_seq"] == 3 and push.args["due_at"] == to_unix_micros(
        NOW + timedelta(minutes=2)
    )


def test_json_args_that_need_escaping_survive_copy(database_url: str) -> None:
    # IDs never hold these characters; the writer must still not corrupt what it is given.
    args: dict[str, int | str] = {"user_id": 'a"b\\c\td', "n": 1}
    with psycopg.connect(database_url) as conn:
        writer = JobWriter(conn, NOW)
        writer.add(JobSpec("test.work", args, NOW, 3))
        writer.finish()
        conn.commit()

    assert stored(database_url) == [("test.work", args, NOW, 3, None)]
