"""The gateway's grouped transactions: requests that arrive while one runs are stored
together by the next; a request cancelled while its group's transaction runs leaves
the queue as it was (the transaction finishes, the next requests are served)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import trio
import trio.testing

from bothy_notify.config import MatrixGatewayConfig, PushConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.matrix.apps import AppRoute
from bothy_notify.matrix.gateway import MatrixGateway
from bothy_notify.matrix.notification import parse
from bothy_notify.store.db import Database
from bothy_notify.store.matrix import Pushkey, pushkeys

APP = "im.example.ios"
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
KA, KB, KC, KD = ("a1" * 32, "b2" * 32, "c3" * 32, "d4" * 32)


def request(pushkey: str, event: str) -> Any:
    body = {
        "notification": {
            "event_id": f"${event}:example.org",
            "room_id": "!room:example.org",
            "counts": {"unread": 1},
            "devices": [{"app_id": APP, "pushkey": pushkey}],
        }
    }
    return parse(body, max_devices=10)


def hold(database_url: str, pushkey: str) -> psycopg.Connection[Any]:
    """A transaction that inserted ``pushkey``'s registration and stays open: a notify
    to the same pushkey waits for it (the registration's unique index)."""
    conn = psycopg.connect(database_url)
    pushkey_row = Pushkey(f"matrix-gateway/{APP}", APP, "apns", pushkey)
    pushkeys(conn, [pushkey_row], NOW, renew_after=timedelta(days=1))
    return conn


async def test_a_request_cancelled_while_its_group_is_stored_leaves_the_queue_whole(
    db: Database, database_url: str
) -> None:
    gateway = MatrixGateway(
        db=db,
        clock=FakeClock(NOW),
        config=MatrixGatewayConfig(apps={APP: "apns"}, answer_within=timedelta(milliseconds=50)),
        push=PushConfig(),
        routes={APP: AppRoute(APP, "apns", None, None)},
        check=None,
        metrics=Metrics(),
    )
    first, second = hold(database_url, KA), hold(database_url, KB)
    answers: dict[str, list[str]] = {}
    a_done = trio.Event()

    async def serve(name: str, pushkey: str, done: trio.Event | None = None) -> None:
        answers[name] = await gateway.notify(request(pushkey, name))
        if done is not None:
            done.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, "a", KA, a_done)  # leads; waits for `first`
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(serve, "b", KB)  # queued
            cancelled = trio.CancelScope()

            async def serve_c() -> None:
                with cancelled:
                    await serve("c", KC)

            nursery.start_soon(serve_c)  # queued
            await trio.testing.wait_all_tasks_blocked()
            assert len(gateway._queue) == 2

            await trio.to_thread.run_sync(first.rollback)
            await a_done.wait()  # b leads the group [b, c]; it waits for `second`
            await trio.testing.wait_all_tasks_blocked()
            assert gateway._queue == []
            cancelled.cancel()
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(second.rollback)
        assert cancelled.cancelled_caught
        assert set(answers) == {"a", "b"}
        # Nothing is left waiting: the next request leads its own transaction.
        assert await gateway.notify(request(KD, "d")) == []
        assert not gateway._running and gateway._queue == []
        stored = await db.run(
            lambda c: c.execute("SELECT count(*) FROM bothy.jobs").fetchone(), transaction=False
        )
        assert stored == (4,)  # c's job was written with its group
    finally:
        first.close()
        second.close()
