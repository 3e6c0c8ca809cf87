"""The store's listener alone, on the real embedded PostgreSQL: started means
listening, a backend the server ends is reconnected and caught up, a wait ends
at once on cancellation while work on the connection is never abandoned, and
callers see store errors only.

Where a delay matters the test runs on Trio's ``MockClock`` at real speed and
jumps it past the backoff; nothing sleeps for a delay.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from functools import partial

import psycopg
import pytest
import trio
import trio.testing

from bothy_notify.kernel.backoff import Backoff
from bothy_notify.store.db import Conn, StoreError, StoreUnavailable
from bothy_notify.store.listen import (
    Listener,
    Listening,
    Notification,
    delivering,
    reconnect_backoff,
)

CHANNEL = "bothy_listen_test"
OTHER = "bothy_listen_other"
RECONNECT = 20.0
"""The first reconnection wait of these tests: far longer than a test may take, so a
reconnection that happens shows the clock was jumped, not waited for."""


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    """Trio's clock at real speed (sockets and threads need real time), moved on by
    the tests past waits they must not sit through."""
    return trio.testing.MockClock(rate=1.0)


def notify(url: str, channel: str, payload: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def failed(listener: Listener, times: int) -> bool:
    return listener.statistics().failures == times


async def until(check: Callable[[], bool], what: str) -> None:
    with trio.fail_after(10):
        while not check():
            await trio.sleep(0.005)
    assert check(), what


class Received:
    """What a delivering listener was handed, and the catch-ups it made."""

    def __init__(self) -> None:
        self.notes: list[Notification] = []
        self.catch_ups: list[int] = []

    def on_notify(self, notes: list[Notification]) -> None:
        self.notes.extend(notes)

    async def catch_up(self, listening: Listening) -> None:
        self.catch_ups.append(listening.backend_pid)

    def payloads(self) -> list[str]:
        return [n.payload for n in self.notes]


def listener_for(url: str, received: Received, *, reconnect: float = RECONNECT) -> Listener:
    return Listener(
        url,
        (CHANNEL, OTHER),
        name="test",
        reconnect=reconnect_backoff(reconnect),
        catch_up=received.catch_up,
    )


async def test_a_notify_sent_right_after_started_is_received(
    database_url: str, nursery: trio.Nursery
) -> None:
    received = Received()
    listener = listener_for(database_url, received)

    await nursery.start(listener.run, delivering(received.on_notify))
    await trio.to_thread.run_sync(notify, database_url, OTHER, "first")

    await until(lambda: received.payloads() == ["first"], "the notification")
    assert received.notes[0].channel == OTHER
    assert listener.statistics().listening
    assert len(received.catch_ups) == 1  # the first connection is caught up too


async def test_a_terminated_backend_is_reconnected_after_the_backoff_and_caught_up(
    database_url: str,
    nursery: trio.Nursery,
    jump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    received = Received()
    listener = listener_for(database_url, received)
    await nursery.start(listener.run, delivering(received.on_notify))
    await until(lambda: len(received.catch_ups) == 1, "the first catch-up")
    first_pid = received.catch_ups[0]

    await trio.to_thread.run_sync(terminate, database_url, first_pid)

    await until(lambda: listener.statistics().reconnect_wait is not None, "the backoff")
    assert listener.statistics().reconnect_wait == RECONNECT
    assert not listener.connected
    lost = [r for r in caplog.records if r.name == "bothy.store.listen"]
    assert [r.__dict__["error_type"] for r in lost] == ["StoreUnavailable(OperationalError)"]
    assert lost[0].__dict__["listener"] == "test"

    jump_clock.jump(RECONNECT)
    await until(lambda: len(received.catch_ups) == 2, "the catch-up after reconnecting")
    assert received.catch_ups[1] != first_pid
    assert listener.statistics().connections == 2

    await trio.to_thread.run_sync(notify, database_url, CHANNEL, "after")
    await until(lambda: received.payloads() == ["after"], "a notification after reconnecting")


async def test_an_unreachable_database_is_retried_with_a_doubling_backoff(
    nursery: trio.Nursery, jump_clock: trio.testing.MockClock
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    received = Received()
    listener = listener_for(f"postgresql://nobody@127.0.0.1:{port}/none", received, reconnect=1.0)
    nursery.start_soon(listener.run, delivering(received.on_notify))

    waits = []
    for failures in range(1, 6):
        await until(partial(failed, listener, failures), "a failed attempt")
        await until(lambda: listener.statistics().reconnect_wait is not None, "a backoff")
        wait = listener.statistics().reconnect_wait
        assert wait is not None
        waits.append(wait)
        jump_clock.jump(wait)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert received.catch_ups == [] and listener.statistics().connections == 0


async def test_cancelling_a_wait_ends_it_at_once(database_url: str) -> None:
    listener = listener_for(database_url, Received())
    waiting = trio.Event()

    async def serve(listening: Listening) -> None:
        await listening.listen()
        waiting.set()
        await listening.wait()  # no time limit: only the cancellation can end it
        raise AssertionError("nothing was notified")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run, serve)
            await waiting.wait()
            nursery.cancel_scope.cancel()
    assert not listener.connected
    assert listener.statistics().failures == 0  # ended by the cancellation, nothing else


async def test_work_begun_after_the_wait_finishes_although_its_caller_is_cancelled(
    database_url: str,
) -> None:
    listener = listener_for(database_url, Received())
    entered, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def work(conn: Conn, notes: list[Notification]) -> None:
        entered.set()
        release.wait(10)
        row = conn.execute("SELECT 1").fetchone()
        finished.append(row[0] if row else 0)

    async def serve(listening: Listening) -> None:
        await listening.listen()
        await listening.wait_then(work, 0)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run, serve)
            await trio.to_thread.run_sync(entered.wait)
            nursery.cancel_scope.cancel()  # reaches the listener's task at once
            release.set()
    assert finished == [1]


async def test_a_notification_before_the_work_starts_it_in_the_same_thread_call(
    database_url: str, nursery: trio.Nursery
) -> None:
    listener = listener_for(database_url, Received())
    seen: list[tuple[list[str], str]] = []
    done = trio.Event()

    def work(conn: Conn, notes: list[Notification]) -> None:
        seen.append(([n.payload for n in notes], threading.current_thread().name))

    async def serve(listening: Listening) -> None:
        await listening.listen()
        await listening.wait_then(work)  # no limit: returns with the notification
        done.set()
        await trio.sleep_forever()

    await nursery.start(listener.run, serve)
    await trio.to_thread.run_sync(notify, database_url, CHANNEL, "go")
    with trio.fail_after(10):
        await done.wait()
    assert seen == [(["go"], "listener test")]


async def test_a_nudge_ends_a_wait_as_a_notification_would_before_or_during_it(
    database_url: str,
) -> None:
    listener = listener_for(database_url, Received())
    ended: list[list[Notification]] = []

    async def serve(listening: Listening) -> None:
        await listening.listen()
        listener.nudge()  # no wait runs: the next one ends at once
        ended.append(await listening.wait())  # no time limit: only a nudge ends it
        async with trio.open_nursery() as nursery:

            async def nudge_while_waiting() -> None:
                await trio.testing.wait_all_tasks_blocked()
                listener.nudge()

            nursery.start_soon(nudge_while_waiting)
            ended.append(await listening.wait())

    with trio.fail_after(10):
        await listener.run(serve)
    assert ended == [[], []]


async def test_a_nudge_ends_one_wait_only(
    database_url: str, jump_clock: trio.testing.MockClock
) -> None:
    listener = listener_for(database_url, Received())
    outcome: list[str] = []

    async def serve(listening: Listening) -> None:
        await listening.listen()
        listener.nudge()
        listener.nudge()  # two nudges before a wait still end that one wait only
        await listening.wait()
        with trio.move_on_after(RECONNECT) as scope:
            async with trio.open_nursery() as nursery:

                async def jump_once_waiting() -> None:
                    await trio.testing.wait_all_tasks_blocked()
                    jump_clock.jump(RECONNECT)

                nursery.start_soon(jump_once_waiting)
                await listening.wait()
                outcome.append("the second wait ended by itself")
        if scope.cancelled_caught:
            outcome.append("the second wait lasted until it was cancelled")

    await listener.run(serve)
    assert outcome == ["the second wait lasted until it was cancelled"]


def test_a_nudge_before_the_listener_runs_is_nothing() -> None:
    listener = Listener("postgresql://", [CHANNEL], name="test", reconnect=Backoff(1, 1))
    listener.nudge()  # no pipe yet: no error, nothing kept for later
    assert not listener.connected


async def test_database_errors_reach_serve_as_store_errors(database_url: str) -> None:
    listener = listener_for(database_url, Received())
    caught: list[BaseException] = []

    async def serve(listening: Listening) -> None:
        await listening.listen()
        try:
            await listening.run(lambda conn: conn.execute("SELECT * FROM no_such_table"))
        except Exception as exc:
            caught.append(exc)

    with trio.fail_after(10):
        await listener.run(serve)  # serve returned: so does the listener
    assert len(caught) == 1
    assert type(caught[0]) is StoreError
    assert isinstance(caught[0].__cause__, psycopg.errors.UndefinedTable)
    assert not listener.connected


async def test_a_store_error_out_of_serve_reconnects_and_a_bug_ends_the_listener(
    database_url: str, jump_clock: trio.testing.MockClock
) -> None:
    received = Received()
    listener = listener_for(database_url, received)
    calls: list[int] = []

    async def serve(listening: Listening) -> None:
        await listening.listen()
        calls.append(listening.backend_pid)
        if len(calls) == 1:
            raise StoreUnavailable("the database cannot be reached")
        raise RuntimeError("a bug")

    async def jump_when_waiting() -> None:
        await until(lambda: listener.statistics().reconnect_wait is not None, "the backoff")
        jump_clock.jump(RECONNECT)

    # (The test's own deadline bounds it: a fail_after here would see the jump.)
    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jump_when_waiting)
            await listener.run(serve)
    assert raised.group_contains(RuntimeError, match="a bug")
    assert len(calls) == 2 and len(received.catch_ups) == 2
    assert not listener.connected


async def test_a_standby_is_started_before_it_listens(
    database_url: str, nursery: trio.Nursery
) -> None:
    received = Received()
    listener = listener_for(database_url, received)
    go = trio.Event()

    async def serve(listening: Listening) -> None:
        listening.standing_by()
        await go.wait()
        await listening.listen()
        while True:
            received.on_notify(await listening.wait())

    await nursery.start(listener.run, serve)
    stats = listener.statistics()
    assert stats.connected and not stats.listening and received.catch_ups == []

    go.set()
    await until(lambda: listener.statistics().listening, "listening")
    await trio.to_thread.run_sync(notify, database_url, CHANNEL, "now")
    await until(lambda: received.payloads() == ["now"], "the notification")


def test_a_channel_that_listen_would_need_quoted_is_refused() -> None:
    for bad in ("Bothy", "bothy-events", "bothy events; DROP TABLE x", ""):
        with pytest.raises(ValueError, match="channel"):
            Listener("postgresql://", [bad], name="test", reconnect=Backoff(1, 1))


@pytest.fixture(autouse=True)
def _listener_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bothy.store.listen")
