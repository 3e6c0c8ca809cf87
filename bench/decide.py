"""Benchmark: the consumer round deciding message events.

Appends N ``message.created`` events with F followers each through the SQL
function ``bothy.append_event`` (as a producer would), then times the real
round (``ConsumerRound`` with role ``worker`` wiring: nobody connected, every
follower's phone gets an immediate ``notify.push_send``), and in the same run
a bare ``COPY`` of the same number of job rows into the same table, then one in
COPY's binary format (what the round sends). Prints events/s, push_send jobs/s
and their ratio to each bare COPY (``ratio_to_copy``: the text one, as this
benchmark has always reported; ``ratio_to_binary_copy``: the binary one).

CPU is measured too, since the machine may be shared: this process's CPU
during the round (the round runs on this thread) and PostgreSQL's (the
postmaster and its children, from ``/proc``), per job, and the same for the
bare COPY; ``cpu_ratio`` = the bare COPY's CPU per row (client + server) / the
round's CPU per job (client + server): the ratio with nothing overlapped, which
a machine whose cores are all busy shows (a quiet one overlaps the round's
Python with the server's ingest). ``--profile FILE`` records the round with
py-spy (collapsed stacks in FILE, top entries printed).

``--scale`` runs the same round against tables of a large deployment instead:
100,000 people, 1,000,000 follows and 10,000 threads written with COPY
(``bench/_scale.py``: a skewed number of followers per thread, a tenth of the
follows at level ``all``), the messages going to threads drawn at random.
``--explain`` then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of every statement of one
round over a burst of messages to the most followed threads (20,000-30,000
recipient keys at ``--scale``, decided as a node of a cluster with coalescing, so
that every read of the round is sent), of one round of a single message, and of
the job runner's and handlers' statements for the jobs they left; each with its
generic plan (the one a prepared statement comes to) when that differs.

``--quiet`` measures what quiet hours cost the round (issue 30): ``--rounds``
alternations, in one database, of a round over ``--events`` new messages while
nobody has quiet hours (``none``) and one while 60 of the followers have the
pathological schedule (``dst14``: 14 back-to-back entries every day in
Europe/Berlin, quiet all the time; ``bench/_quiet.py``), which the round
evaluates for each of them in every group it decides. Reported: the CPU per job
(one job per recipient: this process + PostgreSQL) of each and their ratio.
``--batch 1`` is the worst case (a round per message, so an evaluation per
quiet recipient per message).

``--mention-all`` measures what a group mention costs the round (issue 33):
``--rounds`` alternations, in one database, of a round over ``--events`` plain
messages to a thread that the ``--followers`` members of a space follow at level
``all`` (``plain``) and one over as many messages to another thread of that space,
which nobody follows, each with ``mention_groups: ["all"]`` (``all``: the round
reads the thread's members and mentions each). Every member has a phone, so
each recipient is one job; reported: the CPU per recipient (this process +
PostgreSQL) of each and their ratio. ``--followers 1000`` is the space of 1,000
members of the issue.

Usage: .venv/bin/python bench/decide.py [--events N] [--followers F] [--threads T]
       [--batch B] [--profile FILE] [--scale [--people P] [--follows F]] [--explain]
       [--quiet [--rounds R]] [--mention-all [--rounds R]]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Profiler, bench_database, machine, postgres_cpu, postgres_pid, report
from bench._quiet import PATHOLOGICAL_PEOPLE, pathological_doc, store_quiet
from bench._scale import (
    Scale,
    Seeded,
    burst_messages,
    capture_jobs,
    capture_round,
    explain_all,
    most_followed,
    print_explained,
    seed_scale,
)
from bothy_notify.config import LiveConfig, structure_config
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store.db import connect_dedicated


def seed(url: str, events: int, followers: int, threads: int, batch: int) -> None:
    """Set-up events (consumed before timing starts), then the message events."""
    seed_people(url, followers, threads, batch)
    append_messages(url, messages_of(0, events, threads))


def messages_of(first: int, events: int, threads: int) -> list[tuple[str, dict[str, object]]]:
    """Messages ``first`` to ``first + events - 1``, round-robin over the threads."""
    return [
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
        for m in range(first, first + events)
    ]


def seed_people(url: str, followers: int, threads: int, batch: int) -> None:
    """The followers (a phone each), the threads they follow, consumed by a round."""
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


def append_messages(url: str, messages: list[tuple[str, dict[str, object]]]) -> None:
    """Append ``messages`` through ``bothy.append_event``, a thousand per transaction."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        for i in range(0, len(messages), 1000):
            append(conn, messages[i : i + 1000])
            conn.commit()
    elapsed = time.perf_counter() - started
    print(
        f"appended {len(messages)} message events in {elapsed:.2f}s "
        f"({len(messages) / elapsed:,.0f}/s through bothy.append_event)"
    )


def scale_messages(seeded: Seeded, events: int) -> list[tuple[str, dict[str, object]]]:
    """``events`` messages, each to a thread drawn at random from all of them."""
    rng = random.Random(seeded.scale.seed + 1)
    seqs: dict[str, int] = {}
    out: list[tuple[str, dict[str, object]]] = []
    for m in range(events):
        thread = f"t{rng.randrange(seeded.scale.threads)}"
        seqs[thread] = seqs.get(thread, 0) + 1
        payload: dict[str, object] = {
            "thread_id": thread,
            "message_id": f"m{m}",
            "thread_seq": seqs[thread],
            "author_id": "author",
            "mentions": [],
        }
        out.append(("message.created", payload))
    return out


def append(conn: psycopg.Connection, events: list[tuple[str, dict[str, object]]]) -> None:
    conn.execute(
        "SELECT bothy.append_event(t, p::jsonb) FROM unnest(%s::text[], %s::text[])"
        " WITH ORDINALITY AS e(t, p, n) ORDER BY n",
        ([t for t, _ in events], [json.dumps(p) for _, p in events]),
    )


@dataclass(frozen=True)
class Timed:
    """Wall seconds, this process's CPU seconds and PostgreSQL's CPU seconds of one phase."""

    wall: float
    cpu: float
    pg_cpu: float


class Stopwatch:
    def __init__(self, postmaster: int | None) -> None:
        self._postmaster = postmaster
        self._pg = postgres_cpu(postmaster) if postmaster else 0.0
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def stop(self) -> Timed:
        wall = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        pg = postgres_cpu(self._postmaster) - self._pg if self._postmaster else 0.0
        return Timed(wall, cpu, pg)


def run_round(
    url: str, batch: int, postmaster: int | None = None, profile: str | None = None
) -> tuple[Timed, int, int]:
    config = structure_config(
        {"server": {"role": "worker"}, "notify": {"coalesce_window": "0s", "batch_size": batch}},
        env={},
    )
    consumer = ConsumerRound(
        database_url=url,
        config=LiveConfig(config),
        clock=SystemClock(),
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=Metrics(),
    )
    conn = connect_dedicated(url)
    consumed = 0
    profiler = Profiler(profile) if profile else None
    watch = Stopwatch(postmaster)
    try:
        while True:
            n, blocked = consumer._round_once(conn)
            consumed += n
            if n == 0 and not blocked:
                break
        timed = watch.stop()
    finally:
        conn.close()
        if profiler is not None:
            profiler.stop()
    with psycopg.connect(url) as check:
        (jobs,) = check.execute(
            "SELECT count(*) FROM bothy.jobs WHERE kind = 'notify.push_send'"
        ).fetchone()  # type: ignore[misc]
    return timed, consumed, int(jobs)


BARE_ARGS = {
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
}
_COLUMNS = "COPY bothy.jobs (kind, args, scheduled_at, max_attempts, created_at) FROM STDIN"


def bare_copy(url: str, rows: int, postmaster: int | None = None) -> Timed:
    """COPY ``rows`` ready-made job rows into the same table: the database's ceiling.

    The rows are pre-formatted text, so the ratio compares the round with ingest
    alone (see :func:`bare_binary_copy` for the binary format, which the round uses).
    """
    now = datetime.now(UTC).isoformat()
    args = json.dumps(BARE_ARGS, separators=(",", ":"))
    line = f"notify.push_send\t{args}\t{now}\t5\t{now}\n"
    chunk = line * 1000
    with psycopg.connect(url) as conn:
        watch = Stopwatch(postmaster)
        with conn.cursor() as cur, cur.copy(_COLUMNS) as copy:
            for _ in range(rows // 1000):
                copy.write(chunk)
            copy.write(line * (rows % 1000))
        conn.commit()
        return watch.stop()


def bare_binary_copy(url: str, rows: int, postmaster: int | None = None) -> Timed:
    """The same rows as :func:`bare_copy`, pre-formatted in COPY's binary format (what
    the round's ``JobWriter`` sends): the server then parses no times or integers."""
    micros = (datetime.now(UTC) - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    kind = b"notify.push_send"
    args = b"\x01" + json.dumps(BARE_ARGS, separators=(",", ":")).encode()
    row = (
        struct.pack("!hi", 5, len(kind))
        + kind
        + struct.pack("!i", len(args))
        + args
        + struct.pack("!iqiiiq", 8, micros, 4, 5, 8, micros)
    )
    chunk = row * 1000
    with psycopg.connect(url) as conn:
        watch = Stopwatch(postmaster)
        with conn.cursor() as cur, cur.copy(_COLUMNS + " (FORMAT BINARY)") as copy:
            copy.write(b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0))
            for _ in range(rows // 1000):
                copy.write(chunk)
            copy.write(row * (rows % 1000) + struct.pack("!h", -1))
        conn.commit()
        return watch.stop()


def explain_rounds(url: str, batch: int, burst_threads: int) -> dict[str, object]:
    """``--explain``: the plans of a burst round, a one-message round and the jobs'
    statements (see the module's docstring); returns their figures for the report."""
    config = structure_config(
        {"server": {"role": "all"}, "cluster": {"mode": "multi"}, "notify": {"batch_size": batch}},
        env={},
    )
    popular = most_followed(url, burst_threads)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT node_id::text FROM bothy.nodes LIMIT 1").fetchone()
    node_id = row[0] if row else "00000000-0000-0000-0000-000000000000"
    append_messages(url, burst_messages(popular, batch, 1_000_000))
    append_messages(url, burst_messages(popular[-1:], 1, 2_000_000))
    timeout = config.cluster.node_timeout
    figures: dict[str, object] = {}
    for name, limit in (("burst", batch), ("one message", 1)):
        explained = explain_all(url, capture_round(url, config, timeout, limit))
        title = f"round of {limit} message(s) to the {len(popular)} most followed threads"
        if limit == 1:
            title = "round of one message"
        print_explained(title, explained)
        figures[name] = [e.figures() for e in explained]
    explained = explain_all(url, capture_jobs(url, config, node_id))
    print_explained("job runner and handlers", explained)
    figures["jobs"] = [e.figures() for e in explained]
    return figures


def alternated_run(
    url: str, batch: int, postmaster: int | None, mode: str, expected: tuple[int, int], unit: str
) -> tuple[Timed, int]:
    """One round of an alternation over the messages just appended: checks it consumed
    and wrote what ``expected`` (events, jobs) says and prints its CPU per ``unit``
    (one job each)."""
    timed, consumed, jobs = run_round(url, batch, postmaster)
    assert (consumed, jobs) == expected, (consumed, jobs)
    here, pg = timed.cpu * 1e6 / jobs, timed.pg_cpu * 1e6 / jobs
    print(
        f"  {mode:>5}: {here + pg:.1f} us CPU per {unit} ({here:.1f} here + {pg:.1f}"
        f" PostgreSQL), {jobs / timed.wall:,.0f} {unit}s/s",
        flush=True,
    )
    return timed, jobs


def per_unit(
    runs: list[tuple[str, Timed, int]], modes: tuple[str, ...], unit: str
) -> dict[str, tuple[float, float]]:
    """CPU microseconds per job (this process, PostgreSQL) of each mode over all its
    rounds, printed with the ratio to the first mode's."""
    figures = {}
    for mode in modes:
        mine = [(t, j) for m, t, j in runs if m == mode]
        jobs = sum(j for _, j in mine)
        figures[mode] = (
            sum(t.cpu for t, _ in mine) * 1e6 / jobs,
            sum(t.pg_cpu for t, _ in mine) * 1e6 / jobs,
        )
    base = sum(figures[modes[0]])
    for mode, (here, pg) in figures.items():
        print(f"  {mode:>5}: {here + pg:.1f} us CPU per {unit}, ratio {(here + pg) / base:.3f}")
    return figures


QUIET_MODES = ("none", "dst14")


def quiet_runs(args: argparse.Namespace, threads: int) -> None:
    """``--quiet``: the round's CPU per job with nobody in quiet hours and with 60
    people on the pathological schedule, alternated in one database."""
    followers = args.followers
    if followers < PATHOLOGICAL_PEOPLE:
        raise SystemExit(f"--quiet needs --followers {PATHOLOGICAL_PEOPLE} or more")
    quiet_people = [f"user{i}" for i in range(0, followers, followers // PATHOLOGICAL_PEOPLE)]
    quiet_people = quiet_people[:PATHOLOGICAL_PEOPLE]
    runs: list[tuple[str, Timed, int]] = []
    with bench_database() as url:
        postmaster = postgres_pid(url)
        seed_people(url, followers, threads, args.batch)
        sent = 0
        for _ in range(args.rounds):
            for mode in QUIET_MODES:
                with psycopg.connect(url) as conn, conn.cursor() as cur:
                    cur.execute("DELETE FROM bothy.quiet_hours")
                    cur.execute("DELETE FROM bothy.jobs")
                    if mode == "dst14":
                        store_quiet(cur, [(u, pathological_doc()) for u in quiet_people])
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE bothy.quiet_hours")
                    conn.execute("VACUUM ANALYZE bothy.jobs")
                append_messages(url, messages_of(sent, args.events, threads))
                sent += args.events
                expected = (args.events, args.events * followers)
                timed, jobs = alternated_run(url, args.batch, postmaster, mode, expected, "job")
                runs.append((mode, timed, jobs))
    print(
        f"the round with {PATHOLOGICAL_PEOPLE} of {followers} followers on the pathological"
        f" schedule ({args.rounds} alternations of {args.events} messages, batch {args.batch}):"
    )
    figures = per_unit(runs, QUIET_MODES, "job")
    base = sum(figures["none"])
    report(
        "decide_quiet",
        **{f"cpu_us_per_job_{m}": round(sum(f), 2) for m, f in figures.items()},
        **{f"postgres_cpu_us_per_job_{m}": round(f[1], 2) for m, f in figures.items()},
        ratio_dst14=round(sum(figures["dst14"]) / base, 3),
        rounds=args.rounds,
        events=args.events,
        followers=followers,
        quiet_people=PATHOLOGICAL_PEOPLE,
        batch=args.batch,
    )


GROUP_MODES = ("plain", "all")


def seed_space(url: str, members: int, batch: int) -> None:
    """``members`` people (a phone each) in one space with two threads: ``followed``,
    which all of them follow at level ``all``, and ``quiet``, which nobody follows."""
    people = [f"user{i}" for i in range(members)]
    setup: list[tuple[str, dict[str, object]]] = [
        ("thread.upserted", {"thread_id": "followed", "space_id": "space"}),
        ("thread.upserted", {"thread_id": "quiet", "space_id": "space"}),
    ]
    for user in people:
        setup.append(("user.upserted", {"user_id": user, "kind": "human", "active": True}))
        setup.append(("member.added", {"user_id": user, "scope_id": "space"}))
        setup.append(
            ("thread.followed", {"user_id": user, "thread_id": "followed", "level": "all"})
        )
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
        run_round(url, batch)


def group_messages(mode: str, first: int, events: int) -> list[tuple[str, dict[str, object]]]:
    """``events`` messages of ``mode``: to ``followed`` without mentions, or to
    ``quiet`` with ``mention_groups: ["all"]``."""
    thread = "followed" if mode == "plain" else "quiet"
    out: list[tuple[str, dict[str, object]]] = []
    for m in range(first, first + events):
        payload: dict[str, object] = {
            "thread_id": thread,
            "message_id": f"m{m}",
            "thread_seq": m + 1,
            "author_id": "author",
            "mentions": [],
        }
        if mode == "all":
            payload["mention_groups"] = ["all"]
        out.append(("message.created", payload))
    return out


def group_mention_runs(args: argparse.Namespace) -> None:
    """``--mention-all``: the round's CPU per recipient of plain messages to a thread
    its space follows and of ``all`` mentions in a thread nobody follows,
    alternated in one database."""
    members = args.followers
    runs: list[tuple[str, Timed, int]] = []
    with bench_database() as url:
        postmaster = postgres_pid(url)
        seed_space(url, members, args.batch)
        sent = 0
        for _ in range(args.rounds):
            for mode in GROUP_MODES:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DELETE FROM bothy.jobs")
                    conn.execute("VACUUM ANALYZE bothy.jobs")
                append_messages(url, group_messages(mode, sent, args.events))
                sent += args.events
                expected = (args.events, args.events * members)
                timed, jobs = alternated_run(
                    url, args.batch, postmaster, mode, expected, "recipient"
                )
                runs.append((mode, timed, jobs))
    print(
        f"the round over messages to {members} recipients ({args.rounds} alternations of"
        f" {args.events} messages, batch {args.batch}):"
    )
    figures = per_unit(runs, GROUP_MODES, "recipient")
    base = sum(figures["plain"])
    report(
        "decide_mention_all",
        **{f"cpu_us_per_recipient_{m}": round(sum(f), 2) for m, f in figures.items()},
        **{f"postgres_cpu_us_per_recipient_{m}": round(f[1], 2) for m, f in figures.items()},
        ratio_all=round(sum(figures["all"]) / base, 3),
        rounds=args.rounds,
        events=args.events,
        members=members,
        batch=args.batch,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--followers", type=int, default=10)
    parser.add_argument("--threads", type=int, help="default: 500; 10,000 with --scale")
    parser.add_argument("--batch", type=int, default=500, help="notify.batch_size")
    parser.add_argument("--profile", metavar="FILE", help="py-spy the round into FILE")
    parser.add_argument("--scale", action="store_true", help="the tables of a large deployment")
    parser.add_argument("--people", type=int, default=Scale.people, help="with --scale")
    parser.add_argument("--follows", type=int, default=Scale.follows, help="with --scale")
    parser.add_argument("--explain", action="store_true", help="print the plans of every read")
    parser.add_argument(
        "--burst-threads", type=int, default=60, help="threads of the --explain burst"
    )
    parser.add_argument("--quiet", action="store_true", help="what quiet hours cost the round")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternations with --quiet or --mention-all"
    )
    parser.add_argument(
        "--mention-all", action="store_true", help="what a group mention costs the round"
    )
    args = parser.parse_args()
    threads = args.threads or (Scale.threads if args.scale else 500)
    print(f"machine: {machine()}, load {os.getloadavg()[0]:.2f}")
    if args.quiet:
        quiet_runs(args, threads)
        return
    if args.mention_all:
        group_mention_runs(args)
        return
    scale_figures: dict[str, object] = {}
    with bench_database() as url:
        postmaster = postgres_pid(url)
        if args.scale:
            scale = Scale(people=args.people, follows=args.follows, threads=threads)
            seeded = seed_scale(url, scale)
            append_messages(url, scale_messages(seeded, args.events))
            scale_figures = {"people": scale.people, "follows": scale.follows, "threads": threads}
        else:
            seed(url, args.events, args.followers, threads, args.batch)
        timed, consumed, jobs = run_round(url, args.batch, postmaster, args.profile)
        copy = bare_copy(url, jobs, postmaster)
        binary = bare_binary_copy(url, jobs, postmaster)
        plans = explain_rounds(url, args.batch, args.burst_threads) if args.explain else None
    elapsed, copy_elapsed = timed.wall, copy.wall
    events_per_s = consumed / elapsed if elapsed else 0.0
    jobs_per_s = jobs / elapsed if elapsed else 0.0
    copy_per_s = jobs / copy_elapsed if copy_elapsed else 0.0
    ratio = jobs_per_s / copy_per_s if copy_per_s else 0.0
    per_job = 1e6 / jobs if jobs else 0.0
    round_us, round_pg_us = timed.cpu * per_job, timed.pg_cpu * per_job
    copy_us, copy_pg_us = copy.cpu * per_job, copy.pg_cpu * per_job
    cpu_ratio = (copy_us + copy_pg_us) / (round_us + round_pg_us) if round_us else 0.0
    binary_per_s = jobs / binary.wall if binary.wall else 0.0
    binary_ratio = jobs_per_s / binary_per_s if binary_per_s else 0.0
    binary_us, binary_pg_us = binary.cpu * per_job, binary.pg_cpu * per_job
    print(f"round: {consumed} message events in {elapsed:.2f}s -> {jobs} push_send jobs")
    print(f"  {events_per_s:,.0f} message events/s, {jobs_per_s:,.0f} jobs/s")
    print(f"  CPU per job: {round_us:.1f} us here + {round_pg_us:.1f} us in PostgreSQL")
    per_event = (timed.cpu + timed.pg_cpu) * 1e6 / consumed if consumed else 0.0
    jobs_each = jobs / consumed if consumed else 0.0
    print(f"  CPU per event: {per_event:.0f} us ({jobs_each:.2f} jobs each)")
    print(f"bare COPY of {jobs} job rows: {copy_elapsed:.2f}s, {copy_per_s:,.0f} rows/s")
    print(f"  CPU per row: {copy_us:.1f} us here + {copy_pg_us:.1f} us in PostgreSQL")
    print(f"bare binary COPY of the same rows: {binary.wall:.2f}s, {binary_per_s:,.0f} rows/s")
    print(f"  CPU per row: {binary_us:.1f} us here + {binary_pg_us:.1f} us in PostgreSQL")
    print(f"ratio of the round's jobs/s to the bare COPY: {ratio:.2f} (CPU: {cpu_ratio:.2f})")
    print(f"ratio of the round's jobs/s to the bare binary COPY: {binary_ratio:.2f}")
    report(
        "decide",
        events_per_s=round(events_per_s),
        jobs_per_s=round(jobs_per_s),
        copy_rows_per_s=round(copy_per_s),
        ratio_to_copy=round(ratio, 3),
        events=args.events,
        followers=None if args.scale else args.followers,
        scale=scale_figures or None,
        round_cpu_us_per_job=round(round_us, 2),
        cpu_us_per_event=round(per_event, 1),
        round_postgres_cpu_us_per_job=round(round_pg_us, 2),
        copy_cpu_us_per_row=round(copy_us, 2),
        copy_postgres_cpu_us_per_row=round(copy_pg_us, 2),
        cpu_ratio=round(cpu_ratio, 3),
        copy_binary_rows_per_s=round(binary_per_s),
        copy_binary_postgres_cpu_us_per_row=round(binary_pg_us, 2),
        ratio_to_binary_copy=round(binary_ratio, 3),
        plans=plans,
    )


if __name__ == "__main__":
    main()
