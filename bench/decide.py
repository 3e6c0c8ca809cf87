"""Benchmark: the consumer round deciding message events.

Appends N ``message.created`` events with F followers each through the SQL
function ``bothy.append_event`` (as a producer would), then times the real
round (``ConsumerRound`` with role ``worker`` wiring: nobody connected, every
follower's phone gets an immediate ``notify.push_send``), and in the same run
a bare ``COPY`` of the same number of job rows into the same table. Prints
events/s, push_send jobs/s and their ratio to the bare COPY.

Usage: .venv/bin/python bench/decide.py [--events N] [--followers F] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, report
from bothy_notify.config import structure_config
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store.db import connect_dedicated


def seed(url: str, events: int, followers: int, threads: int, batch: int) -> None:
    """Set-up events (consumed before timing starts), then the message events."""
    people = [f"user{i}" for i in range(followers)]
    setup: list[tuple[str, dict[str, object]]] = []
    for user in people:
        setup.append(("user.upserted", {"user_id": user, "kind": "human", "active": True}))
        setup.append(("member.added", {"user_id": user, "scope_id": "space"}))
    for t in range(threads):
        setup.append(("thread.upserted", {"thread_id": f"t{t}", "space_id": "space"}))
        for user in people:
            setup.append(
                ("thread.followed", {"user_id": user, "thread_id": f"t{t}", "level": "all"})
            )
    messages = [
        (
            "message.created",
            {
                "thread_id": f"t{m % threads}",
                "message_id": f"m{m}",
                "thread_seq": m // threads + 1,
                "author_id": "author",
                "mentions": [],
            },
        )
        for m in range(events)
    ]
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
                " created_at, renewed_at) VALUES (%s, %s, %s, 'fake', %s, %s, %s)",
                [(f"reg-{u}", u, f"phone-{u}", f"token-{u}", now, now) for u in people],
            )
        append(conn, setup)
        conn.commit()
        run_round(url, batch)  # the set-up projections are not what is measured
        started = time.perf_counter()
        for i in range(0, len(messages), 1000):
            append(conn, messages[i : i + 1000])
            conn.commit()
        elapsed = time.perf_counter() - started
    print(
        f"appended {events} message events in {elapsed:.2f}s "
        f"({events / elapsed:,.0f}/s through bothy.append_event)"
    )


def append(conn: psycopg.Connection, events: list[tuple[str, dict[str, object]]]) -> None:
    conn.execute(
        "SELECT bothy.append_event(t, p::jsonb) FROM unnest(%s::text[], %s::text[])"
        " WITH ORDINALITY AS e(t, p, n) ORDER BY n",
        ([t for t, _ in events], [json.dumps(p) for _, p in events]),
    )


def run_round(url: str, batch: int) -> tuple[float, int, int]:
    config = structure_config(
        {"server": {"role": "worker"}, "notify": {"coalesce_window": "0s", "batch_size": batch}},
        env={},
    )
    consumer = ConsumerRound(
        database_url=url,
        config=config,
        clock=SystemClock(),
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=Metrics(),
    )
    conn = connect_dedicated(url)
    consumed = 0
    started = time.perf_counter()
    try:
        while True:
            n, blocked = consumer._round_once(conn)
            consumed += n
            if n == 0 and not blocked:
                break
    finally:
        conn.close()
    elapsed = time.perf_counter() - started
    with psycopg.connect(url) as check:
        (jobs,) = check.execute(
            "SELECT count(*) FROM bothy.jobs WHERE kind = 'notify.push_send'"
        ).fetchone()  # type: ignore[misc]
    return elapsed, consumed, int(jobs)


def bare_copy(url: str, rows: int) -> float:
    """COPY ``rows`` ready-made job rows into the same table: the database's ceiling.

    The rows are pre-formatted text, the fastest way a client can feed COPY, so the
    ratio compares the round with ingest alone and flatters nothing.
    """
    now = datetime.now(UTC).isoformat()
    args = json.dumps(
        {
            "nid": "018f0000-0000-7000-8000-000000000000",
            "user_id": "user1",
            "registration_id": "reg-user1",
            "kind": "message",
            "count": 1,
            "quiet": 0,
            "due_at": 0,
            "appended_at": 0,
            "release_seq": 0,
            "thread_id": "t1",
            "message_id": "m1",
        },
        separators=(",", ":"),
    )
    line = f"notify.push_send\t{args}\t{now}\t5\t{now}\n"
    chunk = line * 1000
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY bothy.jobs (kind, args, scheduled_at, max_attempts, created_at) FROM STDIN"
            ) as copy,
        ):
            for _ in range(rows // 1000):
                copy.write(chunk)
            copy.write(line * (rows % 1000))
        conn.commit()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--followers", type=int, default=10)
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--batch", type=int, default=500, help="notify.batch_size")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with bench_database() as url:
        seed(url, args.events, args.followers, args.threads, args.batch)
        elapsed, consumed, jobs = run_round(url, args.batch)
        copy_elapsed = bare_copy(url, jobs)
    events_per_s = consumed / elapsed if elapsed else 0.0
    jobs_per_s = jobs / elapsed if elapsed else 0.0
    copy_per_s = jobs / copy_elapsed if copy_elapsed else 0.0
    ratio = jobs_per_s / copy_per_s if copy_per_s else 0.0
    print(f"round: {consumed} message events in {elapsed:.2f}s -> {jobs} push_send jobs")
    print(f"  {events_per_s:,.0f} message events/s, {jobs_per_s:,.0f} jobs/s")
    print(f"bare COPY of {jobs} job rows: {copy_elapsed:.2f}s, {copy_per_s:,.0f} rows/s")
    print(f"ratio of the round's jobs/s to the bare COPY: {ratio:.2f}")
    report(
        "decide",
        events_per_s=round(events_per_s),
        jobs_per_s=round(jobs_per_s),
        copy_rows_per_s=round(copy_per_s),
        ratio_to_copy=round(ratio, 3),
        events=args.events,
        followers=args.followers,
    )


if __name__ == "__main__":
    main()
