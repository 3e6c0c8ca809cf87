"""A small world for the fault tests, driven from outside like a real app backend.

People, threads and follows are appended through the outbox path
(``SELECT bothy.append_event(...)`` in the producer's own transaction), so the
load keeps flowing while a daemon is down, and what was appended is exactly
what committed. Counting helpers read the database and the fake provider's
records at the end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.harness import device_token
from tests.procs import DaemonProcess, read_fake_records

Event = tuple[str, dict[str, Any]]


def append_outbox(url: str, events: Sequence[Event]) -> list[int]:
    """Append ``events`` in one transaction through ``bothy.append_event`` (blocking)."""
    seqs: list[int] = []
    with psycopg.connect(url) as conn, conn.transaction():
        for event_type, payload in events:
            row = conn.execute(
                "SELECT bothy.append_event(%s, %s::jsonb)", (event_type, json.dumps(payload))
            ).fetchone()
            assert row is not None
            seqs.append(int(row[0]))
    return seqs


async def append(url: str, events: Sequence[Event]) -> list[int]:
    return await trio.to_thread.run_sync(append_outbox, url, events)


@dataclass
class World:
    """People who follow every thread, each with a phone (fake provider) and some
    with a linux desktop (gateway; linux never delays the phone's push)."""

    people: list[str]
    threads: list[str]
    author: str = "author-0"
    sent: list[str] = field(default_factory=list)
    """message ids appended so far, in order."""

    def setup_events(self) -> list[Event]:
        events: list[Event] = [
            ("user.upserted", {"user_id": self.author, "kind": "human", "active": True})
        ]
        for person in self.people:
            events.append(("user.upserted", {"user_id": person, "kind": "human", "active": True}))
            events.append(("member.added", {"user_id": person, "scope_id": "space-1"}))
        for thread in self.threads:
            events.append(("thread.upserted", {"thread_id": thread, "space_id": "space-1"}))
            for person in self.people:
                events.append(
                    ("thread.followed", {"user_id": person, "thread_id": thread, "level": "all"})
                )
        return events

    def message(self, n: int) -> Event:
        thread = self.threads[n % len(self.threads)]
        message_id = f"msg-{n}"
        self.sent.append(message_id)
        return (
            "message.created",
            {
                "thread_id": thread,
                "message_id": message_id,
                "thread_seq": n + 1,
                "author_id": self.author,
                "mentions": [],
            },
        )


async def register_phone(client: httpx.AsyncClient, api: str, person: str) -> str:
    """Register ``person``'s phone with the fake provider; returns the registration id."""
    response = await client.post(
        f"http://{api}/v1/registrations",
        json={"provider": "fake", "token": f"phone-token-{person}"},
        headers={"authorization": "Bearer " + device_token(person, f"phone-{person}", "ios")},
    )
    assert response.status_code in (200, 201), response.text
    registration_id: str = response.json()["id"]
    return registration_id


async def produce(url: str, world: World, *, rate: float, count: int) -> None:
    """Append ``count`` messages at about ``rate`` per second (in batches of 10ms)."""
    per_tick = max(1, round(rate / 100))
    n = 0
    next_at = trio.current_time()
    while n < count:
        batch = [world.message(n + i) for i in range(min(per_tick, count - n))]
        await append(url, batch)
        n += len(batch)
        next_at += len(batch) / rate
        await trio.sleep_until(next_at)


def progress(url: str) -> tuple[int, int, int]:
    """(events appended, events behind the cursor, due or running jobs)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bothy.events),"
            " (SELECT count(*) FROM bothy.events e, bothy.consumer_cursor c"
            "   WHERE c.name = 'notify' AND (e.xid, e.seq) > (c.xid, c.seq)),"
            " (SELECT count(*) FROM bothy.jobs WHERE state = 'running'"
            "   OR (state = 'available' AND scheduled_at <= now()))"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def dead_letter_count(url: str) -> int:
    """Events the round set aside (none, in a run without poison events)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM bothy.dead_letters").fetchone()
    assert row is not None
    return int(row[0])


async def wait_settled(url: str, timeout: float = 120.0) -> tuple[int, int, int]:
    """Wait until every event is consumed and no job is due or running."""
    with trio.fail_after(timeout):
        while True:
            state = await trio.to_thread.run_sync(progress, url)
            if state[1] == 0 and state[2] == 0:
                return state
            await trio.sleep(0.1)


def unfinished_jobs(url: str) -> int:
    """Jobs not finished yet, due or not (retries wait in the future)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM bothy.jobs WHERE state IN ('available', 'running')"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def wait_finished(url: str, timeout: float = 120.0) -> None:
    """Wait until every event is consumed and every job finished, retries included."""
    with trio.fail_after(timeout):
        while True:
            _appended, behind, _busy = await trio.to_thread.run_sync(progress, url)
            if behind == 0 and await trio.to_thread.run_sync(unfinished_jobs, url) == 0:
                return
            await trio.sleep(0.1)


@dataclass(frozen=True)
class PushCount:
    expected: int
    missing: int
    duplicates: int
    unexpected: int


def count_pushes(record_file: Path, expected: set[tuple[str, str]]) -> PushCount:
    """Compare the fake provider's records with the expected (message id, token) pairs."""
    return compare_pushes(
        (
            (r["payload"].get("message_id", ""), r["token"])
            for r in read_fake_records(record_file)
            # Hints only: a clearing push (kind read) answers a read, not a message.
            if r.get("outcome") == "delivered" and r["payload"].get("kind") != "read"
        ),
        expected,
    )


def compare_pushes(
    delivered: Iterable[tuple[str, str]], expected: set[tuple[str, str]]
) -> PushCount:
    """Compare what a provider delivered, (message id, token) per push, with ``expected``."""
    seen = Counter(delivered)
    return PushCount(
        expected=len(expected),
        missing=len(expected - set(seen)),
        duplicates=sum(n - 1 for n in seen.values()),
        unexpected=len(set(seen) - expected),
    )


@dataclass(frozen=True)
class Account:
    """What became of the events appended: decided, set aside, or still waiting."""

    appended: int
    decided: int
    dead_lettered: int
    behind: int


def account(url: str) -> Account:
    """Count the events appended, those the round consumed (decided or dead-lettered),
    and those still behind the cursor (blocking)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM bothy.events),"
            " (SELECT count(*) FROM bothy.events e, bothy.consumer_cursor c"
            "   WHERE c.name = 'notify' AND (e.xid, e.seq) <= (c.xid, c.seq)),"
            " (SELECT count(*) FROM bothy.dead_letters),"
            " (SELECT count(*) FROM bothy.events e, bothy.consumer_cursor c"
            "   WHERE c.name = 'notify' AND (e.xid, e.seq) > (c.xid, c.seq))"
        ).fetchone()
    assert row is not None
    appended, consumed, dead, behind = (int(v) for v in row)
    return Account(appended, consumed - dead, dead, behind)


async def closing_count(
    url: str,
    node: DaemonProcess,
    pushes: PushCount,
    *,
    pid: int,
    dead_letters: int = 0,
    duplicates_at_most: int = 0,
) -> Account:
    """How every fault test ends: count, then check the daemon.

    - events: every appended event was decided, apart from ``dead_letters``
      planted poison events (set aside, exactly that many), and none waits behind
      the cursor;
    - pushes: none of ``pushes.expected`` missing, none unexpected, duplicates at
      most ``duplicates_at_most`` (what at-least-once delivery allows the test's
      faults);
    - the daemon: the same process (``pid``) still runs and ``/readyz`` is 200
      with every check true.

    Returns the account; prints one line with the figures (for the docs' table).
    """
    counted = await trio.to_thread.run_sync(account, url)
    async with httpx.AsyncClient(timeout=10) as http:
        ready = await http.get(f"{node.api_url}/readyz")
    print(f"closing count: {counted} {pushes} readyz={ready.status_code}")
    assert counted.behind == 0, counted
    assert counted.dead_lettered == dead_letters, counted
    assert counted.appended == counted.decided + counted.dead_lettered, counted
    assert pushes.missing == 0, pushes
    assert pushes.unexpected == 0, pushes
    assert pushes.duplicates <= duplicates_at_most, pushes
    assert node.alive() and node.pid == pid, "the daemon died or was restarted"
    assert ready.status_code == 200, ready.text
    assert all(check is True for check in ready.json()["checks"].values()), ready.text
    return counted
