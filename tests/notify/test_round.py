"""The consumer round: one holder across instances, take-over, and crash safety."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from bothy_notify.config import LiveConfig
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store.db import connect_dedicated
from testkit.daemon import DaemonProcess
from tests.harness import Launch, make_config


def new_round(url: str, clock: FakeClock, poll: str = "50ms", **kw: Any) -> ConsumerRound:
    return ConsumerRound(
        database_url=url,
        config=LiveConfig(make_config(notify={"poll_interval": poll})),
        clock=clock,
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=Metrics(),
        **kw,
    )


def seed(url: str, messages: int, *, per_thread: int = 1) -> None:
    """One follower with a fake registration per thread, then ``messages`` messages."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("user.upserted", {"user_id": "alex", "kind": "human", "active": True}),
        ("member.added", {"user_id": "alex", "scope_id": "space"}),
    ]
    threads = max(1, messages // per_thread)
    for t in range(threads):
        events.append(("thread.upserted", {"thread_id": f"t{t}", "space_id": "space"}))
        events.append(
            ("thread.followed", {"user_id": "alex", "thread_id": f"t{t}", "level": "all"})
        )
    for m in range(messages):
        events.append(
            (
                "message.created",
                {
                    "thread_id": f"t{m % threads}",
                    "message_id": f"m{m}",
                    "thread_seq": m // threads + 1,
                    "author_id": "sam",
                },
            )
        )
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
            " created_at, renewed_at) VALUES ('r1', 'alex', 'phone', 'fake', 'tok', now(), now())"
        )
        for type_, payload in events:
            conn.execute("SELECT bothy.append_event(%s, %s::jsonb)", (type_, json.dumps(payload)))


def push_jobs_by_message(url: str) -> Counter[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT args->>'message_id' FROM bothy.jobs WHERE kind = 'notify.push_send'"
        ).fetchall()
    return Counter(r[0] for r in rows)


def holds(consumer: ConsumerRound) -> bool:
    return consumer.is_holder


async def test_one_holder_and_an_idle_instance_takes_over_on_its_first_try(
    database_url: str,
) -> None:
    clock = FakeClock()
    first, second = new_round(database_url, clock, "300ms"), new_round(database_url, clock, "300ms")
    async with trio.open_nursery() as outer:
        holder_scope = trio.CancelScope()

        async def run_first(task_status: trio.TaskStatus[None]) -> None:
            with holder_scope:
                await first.run(task_status=task_status)

        await outer.start(run_first)
        await outer.start(second.run)
        assert holds(first) and not holds(second)

        attempts_before = second.lock_attempts
        holder_scope.cancel()  # the holder's connection ends
        with trio.fail_after(5):
            while not holds(second):
                await trio.sleep(0.01)
        assert second.lock_attempts == attempts_before + 1
        assert not holds(first)
        outer.cancel_scope.cancel()


def test_an_uncommitted_round_is_decided_again_and_a_committed_one_is_not(
    database_url: str,
) -> None:
    seed(database_url, 6)
    failures = iter([True, False, False, False])

    def crash_once(outcome: RoundOutcome) -> None:
        if next(failures):
            raise RuntimeError("the process died before commit")

    consumer = new_round(database_url, FakeClock(), before_commit=crash_once)
    conn = connect_dedicated(database_url)
    try:
        with pytest.raises(RuntimeError):
            consumer._round_once(conn)
        assert push_jobs_by_message(database_url) == Counter()
        while consumer._round_once(conn)[0]:
            pass
    finally:
        conn.close()
    assert push_jobs_by_message(database_url) == Counter({f"m{i}": 1 for i in range(6)})


@pytest.mark.slow
async def test_killing_the_daemon_mid_round_loses_nothing_and_duplicates_nothing(
    database_url: str, tmp_path: Path, launch: Launch
) -> None:
    total = 400
    seed(database_url, total)
    config_file = tmp_path / "worker.toml"
    config_file.write_text(
        '[server]\nrole = "worker"\napi_listen = "127.0.0.1:0"\n'
        '[database]\nurl = "env:BOTHY_TEST_DATABASE_URL"\n'
        '[notify]\nbatch_size = 7\npoll_interval = "50ms"\ncoalesce_window = "0s"\n'
        '[push.fake]\n[log]\nlevel = "error"\n'
    )
    daemon = DaemonProcess(
        config_file=config_file,
        log_file=tmp_path / "worker.log",
        env={"BOTHY_TEST_DATABASE_URL": database_url},
    )
    daemon.launch()  # killed mid-round, whether or not it is ready by then
    try:
        with trio.fail_after(30):
            while True:
                with psycopg.connect(database_url) as conn:
                    (seq,) = conn.execute("SELECT seq FROM bothy.consumer_cursor").fetchone()  # type: ignore[misc]
                if seq > 0:
                    break
                await trio.sleep(0.005)
    finally:
        await daemon.crash()
    partial = push_jobs_by_message(database_url)
    assert sum(partial.values()) < total, "the daemon finished before it was killed"

    # The restarted node's clock is past the killed node's leases, so its claimed jobs
    # run again instead of waiting.
    node = await launch(
        config=make_config(server={"role": "worker"}, notify={"batch_size": 7}),
        clock=FakeClock(datetime.now(UTC) + timedelta(hours=2)),
    )
    await node.settle(timeout=30)
    assert push_jobs_by_message(database_url) == Counter({f"m{i}": 1 for i in range(total)})
