"""Group commit of appends: requests that arrive together share one statement, and
each keeps its own seqs, its own refusal, and its own cancellation."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from bothy_notify.store.appender import GroupAppender
from bothy_notify.store.db import Database, StoreUnavailable
from bothy_notify.store.direct import StatementError
from bothy_notify.store.events import EventRejected, append, append_direct


def message(n: int) -> tuple[str, dict[str, Any]]:
    payload = {"thread_id": "t", "message_id": f"m{n}", "thread_seq": n, "author_id": "a"}
    return ("message.created", payload)


async def stored(db: Database) -> list[tuple[int, str]]:
    rows = await db.run(
        lambda c: c.execute(
            "SELECT seq, payload->>'message_id' FROM bothy.events ORDER BY seq"
        ).fetchall()
    )
    return [(int(seq), str(m)) for seq, m in rows]


async def test_requests_arriving_together_share_a_statement_and_keep_their_seqs(
    db: Database,
) -> None:
    appender = GroupAppender(db)
    answers: dict[int, list[int]] = {}

    async def post(i: int) -> None:
        answers[i] = await appender.append([message(2 * i + 1), message(2 * i + 2)])

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(post, i)
    # The first goes alone; the seven that queued meanwhile go in one statement.
    assert (appender.statements, appender.batches) == (2, 8)
    rows = dict((m, seq) for seq, m in await stored(db))
    for i, seqs in answers.items():
        assert seqs == [rows[f"m{2 * i + 1}"], rows[f"m{2 * i + 2}"]]
        assert seqs[0] < seqs[1]


async def test_a_refused_event_fails_its_own_request_only(db: Database) -> None:
    appender = GroupAppender(db)
    bad = ("message.created", {"thread_id": "t", "message_id": "bad", "author_id": "a"})
    outcome: dict[str, Any] = {}

    async def post(name: str, batch: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            outcome[name] = await appender.append(batch)
        except EventRejected as exc:
            outcome[name] = exc.field

    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "first", [message(1)])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(post, "good", [message(2)])
        nursery.start_soon(post, "bad", [message(3), bad])
        nursery.start_soon(post, "also good", [message(4)])
    assert outcome["bad"] == "payload.thread_seq"  # the database's own check
    assert sorted(m for _, m in await stored(db)) == ["m1", "m2", "m4"]  # none of the bad one
    assert len(outcome["good"]) == len(outcome["also good"]) == 1


async def test_a_request_cancelled_while_it_waits_writes_nothing_and_blocks_nobody(
    db: Database,
) -> None:
    appender = GroupAppender(db)
    answers: dict[str, list[int]] = {}

    async def post(name: str, n: int) -> None:
        answers[name] = await appender.append([message(n)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(post, "first", 1)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await appender.append([message(2)])
        nursery.start_soon(post, "after", 3)
    assert sorted(answers) == ["after", "first"]
    assert [m for _, m in await stored(db)] == ["m1", "m3"]


async def test_a_database_error_reaches_every_request_of_the_group() -> None:
    appender = GroupAppender(Database("postgresql://bench@127.0.0.1:1/nowhere"))
    errors: list[BaseException] = []

    async def post(n: int) -> None:
        try:
            await appender.append([message(n)])
        except StoreUnavailable as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(post, n)
    assert len(errors) == 3 and len({id(e) for e in errors}) == 3


async def test_the_direct_connection_survives_a_refusal_and_comes_back_after_a_loss(
    db: Database,
) -> None:
    direct = db.direct
    one = b"SELECT $1::text::int + 1"
    assert await direct.query(b"one", one, [b"41"]) == [[b"42"]]
    with pytest.raises(StatementError) as refused:
        await direct.query(b"one", one, [b"x"])
    assert refused.value.sqlstate == "22P02"  # invalid_text_representation
    assert await direct.query(b"one", one, [b"1"]) == [[b"2"]]  # the same connection
    pid = await direct.query(b"pid", b"SELECT pg_backend_pid()::text", [])
    await db.run(
        lambda c: c.execute("SELECT pg_terminate_backend(%s::int)", ((pid[0][0] or b"").decode(),))
    )
    with pytest.raises(StoreUnavailable):
        await direct.query(b"one", one, [b"1"])
    assert await direct.query(b"one", one, [b"2"]) == [[b"3"]]  # connected again


async def test_a_value_jsonb_cannot_hold_is_refused_like_the_pooled_append(db: Database) -> None:
    nul = ("user.upserted", {"user_id": "a", "kind": "human", "active": True, "x": "\x00"})
    with pytest.raises(EventRejected) as direct:
        await append_direct(db, [nul])
    with pytest.raises(EventRejected) as pooled:
        await db.run(lambda c: append(c, [nul]))
    assert (direct.value.field, direct.value.problem) == (pooled.value.field, pooled.value.problem)
    assert await stored(db) == []


class Round:
    """A :class:`~bothy_notify.store.appender.LocalRound` that counts its wake-ups and
    the events committed at each (read on a connection of its own, blocking)."""

    def __init__(self, database_url: str, *, held: bool) -> None:
        self.database_url = database_url
        self.held = held
        self.seen_at_wake: list[int] = []

    @property
    def wakes(self) -> int:
        return len(self.seen_at_wake)

    def holds(self) -> bool:
        return self.held

    def wake(self) -> None:
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute("SELECT count(*) FROM bothy.events").fetchone()
        self.seen_at_wake.append(int(row[0]) if row else -1)


def listening(database_url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute("LISTEN bothy_events")
    return conn


def received(conn: psycopg.Connection[Any]) -> int:
    """How many notifications arrived; blocks for the first one (bounded)."""
    got = list(conn.notifies(timeout=10, stop_after=1))
    return len(got) + len(list(conn.notifies(timeout=0)))


async def test_a_round_held_in_this_process_is_woken_directly_without_a_notify(
    db: Database, database_url: str
) -> None:
    here = Round(database_url, held=True)
    listener = listening(database_url)
    try:
        seqs = await GroupAppender(db, local_round=here).append(
            [message(1), message(2), message(3)]
        )
        assert here.seen_at_wake == [3]  # woken once, after the commit
        assert [m for _, m in await stored(db)] == ["m1", "m2", "m3"]
        assert seqs == [seq for seq, _ in await stored(db)]  # the batch's order
        # An outbox append notifies; it is the only notification (they come in
        # commit order, so the first append's would have come before it).
        await db.run(lambda c: append(c, [message(4)]))
        assert await trio.to_thread.run_sync(received, listener) == 1
    finally:
        listener.close()


async def test_a_round_held_elsewhere_is_woken_by_notify(db: Database, database_url: str) -> None:
    elsewhere = Round(database_url, held=False)
    listener = listening(database_url)
    try:
        await GroupAppender(db, local_round=elsewhere).append([message(1)])
        assert elsewhere.wakes == 0
        assert await trio.to_thread.run_sync(received, listener) == 1
    finally:
        listener.close()


async def test_a_refused_batch_does_not_wake_the_round(db: Database, database_url: str) -> None:
    here = Round(database_url, held=True)
    bad = ("message.created", {"thread_id": "t", "message_id": "bad", "author_id": "a"})
    with pytest.raises(EventRejected):
        await GroupAppender(db, local_round=here).append([bad])
    assert here.wakes == 0 and await stored(db) == []
