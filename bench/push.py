"""Benchmark: ``notify.push_send`` jobs through the real runner to a fake APNs.

The fake APNs runs in its own process (``testkit/fakes``): ``--fake nginx``
(the default: nginx with HTTP/2 and TLS answering APNs-shaped 200s at C speed,
installed from Debian's packages when missing) or ``--fake python``
(``testkit/fakes/apns.py``, which checks every request the way Apple does
and costs more CPU per request than the client). In one run:

1. bare: a loop of ``--concurrency`` tasks posting the provider's exact
   requests to the same fake with the same client the provider uses
   (``bench/http2_clients.py``'s ``pycurl`` loop): requests/s;
2. pipeline: ``--jobs`` push_send jobs inserted at once into the embedded
   PostgreSQL, run by a real daemon (role worker: job runner, the push handler (HintPush),
   the APNs provider built from ``[push.apns]``, per-provider limiter,
   results recorded in batches): pushes/s from the insert's commit to the last
   job recorded, and the CPU per push of this process (the daemon) and of
   PostgreSQL's processes;
3. stall: the fake stops answering; ``--stall-jobs`` more jobs are inserted and
   the process's resident memory is sampled for ``--stall-seconds`` (in-flight
   sends stay bounded by ``push.max_in_flight``), then the fake answers again.

Prints pushes/s, bare/s, their ratio, CPU per push, the memory figures, and a
last JSON line.

With ``--processes N`` the pipeline phase runs as real commands instead:
``bothy-notify run --role worker --processes 1`` and ``... --processes N``
(``server.processes``: N node processes from one command) in turn, ``--rounds``
times each, alternating, against the same fake and database; each run is
measured from the insert's commit to the last job's ``finished_at`` (the
database is polled every 200 ms for the end), with the CPU of the command and
all its node processes and of PostgreSQL read from ``/proc``. The
stall phase is skipped. The last line then reports the N-process figures, the
single-process ones (``single_*``) and their ratio (``scaling``).

With ``--provider webpush`` (nginx fake only) one daemon has both ``[push.apns]``
and ``[push.webpush]`` (subscriptions at ``https://localhost:<port>/wp/<id>``,
resolved before every attempt and pinned, each push encrypted for its own
subscription key and VAPID-signed), and ``--rounds`` alternations of an APNs
batch and a Web Push batch of ``--jobs`` each are measured in turn: pushes/s and
CPU per push (daemon + PostgreSQL) of each, their ratio, and the cost of the
RFC 8291 encryption alone (an ephemeral key pair, the ECDH, HKDF and AES-GCM of
one payload) measured in this process. The stall phase is skipped.

With ``--badge`` each person follows 20 threads, 10 of them unread, and
``--rounds`` alternations of a daemon with ``push.badge = "off"`` and one with
``"unread_threads"`` (the count read once per claimed batch) each run ``--jobs``
pushes: the CPU per push of each (daemon + PostgreSQL), their difference and
ratio (the target: the badge must not double the CPU per push). The stall phase
is skipped.

With ``--clear`` ``--rounds`` alternations of a batch of ``--jobs`` push_send jobs
and one of ``--jobs`` ``notify.push_clear`` jobs (clear-on-read: each of a mark
of its own, so every clear is sent) run in one daemon: the CPU per clear push
and per push (daemon + PostgreSQL) and their ratio. The stall phase is skipped.

With ``--quiet`` ``--rounds`` alternations of five batches of ``--jobs``
push_send jobs, each in a fresh daemon: nobody has quiet hours (``none``);
everybody has quiet hours that do not cover now (``set``: each send reads and
evaluates them, and sends); everybody is snoozed (``held``: each push is held,
a row of ``bothy.held_pushes`` and the person's summary queued, nothing sent);
60 people are snoozed and nobody else has quiet hours (``snooze60``); the same
60 people have the pathological schedule of issue 30 instead (``dst14``: 14
back-to-back entries every day in Europe/Berlin, quiet all the time, so each
of their sends works out when the period ends; ``bench/_quiet.py``). Reported:
the CPU per push of each (daemon + PostgreSQL) and the ratios to ``none``, and
``dst14`` to ``snooze60`` (the same pushes held: the schedule's cost alone).
The stall phase is skipped.

Usage: .venv/bin/python bench/push.py [--fake nginx|python] [--jobs N] [--bare N]
       [--registrations R] [--concurrency C] [--max-in-flight M] [--stall-seconds S]
       [--profile FILE] [--processes N [--rounds R]] [--provider apns|webpush [--rounds R]]
       [--badge [--rounds R]] [--clear [--rounds R]] [--quiet [--rounds R]]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    Meter,
    Profiler,
    bench_database,
    machine,
    machine_busy,
    postgres_cpu,
    postgres_pid,
    process_cpu,
    report,
)
from bench._daemon import BenchDaemon  # noqa: E402
from bench._quiet import (  # noqa: E402
    PATHOLOGICAL_PEOPLE,
    pathological_doc,
    snooze_doc,
    store_quiet,
)
from bench.http2_clients import run_client  # noqa: E402
from bothy_notify.config import structure_config  # noqa: E402
from bothy_notify.kernel.clock import to_unix_micros  # noqa: E402
from bothy_notify.notify.jobs.args import (  # noqa: E402
    PUSH_CLEAR,
    PUSH_SEND,
    PushClearArgs,
    PushSendArgs,
)
from bothy_notify.push.apns import ApnsProvider  # noqa: E402
from bothy_notify.push.webpush import (  # noqa: E402
    encrypt,
    generate_vapid_key,
    pack_keys,
)
from bothy_notify.wiring import Daemon  # noqa: E402
from testkit.daemon import DaemonFailed  # noqa: E402
from testkit.fakes import KEY_ID, TEAM_ID, TOPIC, FakeApnsServer, start_fake  # noqa: E402


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    fields: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def seed_people(cur: psycopg.Cursor[Any], people: list[str]) -> None:
    """Active humans, members of the space of thread t1."""
    cur.executemany(
        "INSERT INTO bothy.users (user_id, kind, active) VALUES (%s, 'human', true)",
        [(u,) for u in people],
    )
    cur.executemany(
        "INSERT INTO bothy.members (scope_id, user_id) VALUES ('space', %s)",
        [(u,) for u in people],
    )


def seed(url: str, registrations: int) -> list[tuple[str, str]]:
    """People, a thread they can read, and one APNs registration each."""
    now = datetime.now(UTC)
    people = [f"user{i}" for i in range(registrations)]
    regs = [(f"reg-{u}", u) for u in people]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        seed_people(cur, people)
        cur.execute("INSERT INTO bothy.threads (thread_id, space_id) VALUES ('t1', 'space')")
        cur.executemany(
            "INSERT INTO bothy.devices (device_id, user_id, platform, state)"
            " VALUES (%s, %s, 'ios', 'active')",
            [(f"phone-{u}", u) for u in people],
        )
        cur.executemany(
            "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
            " environment, created_at, renewed_at)"
            " VALUES (%s, %s, %s, 'apns', %s, 'production', %s, %s)",
            [(r, u, f"phone-{u}", f"{i:064x}", now, now) for i, (r, u) in enumerate(regs)],
        )
    return regs


BADGE_THREADS = 20
"""Threads each person follows in ``--badge`` runs, half of them unread: the badge
query then counts real rows, as it would for a person in a busy workspace."""


def seed_unread(url: str, regs: list[tuple[str, str]]) -> None:
    """Each person follows ``BADGE_THREADS`` threads of five messages, and has read
    the first half to the end: a badge of ``BADGE_THREADS / 2``."""
    threads = [f"b{n}" for n in range(BADGE_THREADS)]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO bothy.threads (thread_id, space_id, last_message_seq)"
            " VALUES (%s, 'space', 5)",
            [(t,) for t in threads],
        )
        cur.executemany(
            "INSERT INTO bothy.follows (user_id, thread_id, level) VALUES (%s, %s, 'all')",
            [(u, t) for _, u in regs for t in threads],
        )
        cur.executemany(
            "INSERT INTO bothy.read_states (user_id, thread_id, last_read_seq) VALUES (%s, %s, 5)",
            [(u, t) for _, u in regs for t in threads[: BADGE_THREADS // 2]],
        )


QUIET_MODES = ("none", "set", "held", "snooze60", "dst14")
"""``--quiet``'s batches: nobody with quiet hours, everybody's set but not quiet
now, everybody snoozed, 60 people snoozed, 60 people with the pathological schedule."""


def set_quiet(url: str, regs: list[tuple[str, str]], mode: str) -> None:
    """Give every person of ``regs`` the quiet hours of ``mode`` (and drop what an
    earlier batch held or queued)."""
    now = datetime.now(UTC)
    if mode == "set":  # an hour that starts six hours from now: not quiet during the run
        start = (now + timedelta(hours=6)).strftime("%H:00")
        end = (now + timedelta(hours=7)).strftime("%H:00")
        days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
        doc = {
            "time_zone": "Europe/Berlin",
            "schedule": [{"days": days, "start": start, "end": end}],
            "snooze_until": None,
            "breakthrough": ["mentions"],
        }
    elif mode == "dst14":
        doc = pathological_doc()
    else:
        doc = snooze_doc(now)
    people = [u for _, u in regs]
    if mode in ("snooze60", "dst14"):  # the same 60 people, spread over the batch
        people = people[:: max(1, len(people) // PATHOLOGICAL_PEOPLE)][:PATHOLOGICAL_PEOPLE]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM bothy.quiet_hours")
        cur.execute("DELETE FROM bothy.held_pushes")
        cur.execute("DELETE FROM bothy.jobs WHERE kind = 'notify.quiet_summary'")
        if mode != "none":
            store_quiet(cur, [(u, doc) for u in people])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE bothy.quiet_hours")


def insert_jobs(url: str, regs: list[tuple[str, str]], count: int, start: int) -> float:
    """Insert ``count`` push_send jobs in one transaction; returns the commit time."""
    now = datetime.now(UTC)
    micros = to_unix_micros(now)
    rows = []
    for n in range(start, start + count):
        reg, user = regs[n % len(regs)]
        args = PushSendArgs(
            nid=f"0190c0de-0000-7000-8000-{n:012x}",
            user_id=user,
            registration_id=reg,
            kind="message",
            count=1,
            quiet=False,
            due_at=micros,
            appended_at=micros,
            thread_id="t1",
            message_id=f"m{n}",
        ).to_args()
        rows.append((PUSH_SEND, psycopg.types.json.Jsonb(args), now, 5, now))
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                rows,
            )
        conn.execute("NOTIFY bothy_jobs")
    return time.perf_counter()


def insert_clears(url: str, regs: list[tuple[str, str]], count: int, start: int) -> float:
    """Insert ``count`` push_clear jobs, each with a mark of its own (registration,
    thread ``c<n>``), in one transaction; returns the commit time."""
    now = datetime.now(UTC)
    jobs, marked = [], []
    for n in range(start, start + count):
        reg, user = regs[n % len(regs)]
        args = PushClearArgs(user_id=user, registration_id=reg, thread_id=f"c{n}").to_args()
        jobs.append((PUSH_CLEAR, psycopg.types.json.Jsonb(args), now, 5, now))
        marked.append((reg, f"c{n}", user, now))
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.push_marks (registration_id, thread_id, user_id, marked_at,"
                " clear_pending) VALUES (%s, %s, %s, %s, true)",
                marked,
            )
            cur.executemany(
                "INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)"
                " VALUES (%s, %s, %s, %s, %s)",
                jobs,
            )
        conn.execute("NOTIFY bothy_jobs")
    return time.perf_counter()


def finished(daemon: Daemon, kind: str = PUSH_SEND) -> int:
    """Jobs of ``kind`` recorded as finished by this daemon (its own counter: no polling load)."""
    total = 0.0
    for metric in daemon.metrics.jobs_finished.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("kind") == kind:
                total += sample.value
    return int(total)


async def wait_finished(daemon: Daemon, target: int, kind: str = PUSH_SEND) -> None:
    """Return once ``target`` jobs of ``kind`` are recorded (the caller bounds the wait)."""
    # The runner has no completion event to wait on; polling its in-process counter is free.
    while finished(daemon, kind) < target:  # noqa: ASYNC110
        await trio.sleep(0.01)


def worker_config(args: argparse.Namespace, fake: FakeApnsServer) -> dict[str, Any]:
    """The pipeline's daemon: role worker, the runner's sizes, APNs at the fake."""
    return {
        "server": {"role": "worker", "api_listen": "127.0.0.1:0", "drain_period": "1s"},
        "database": {"pool_size": args.pool},
        "notify": {"poll_interval": "1s"},
        "jobs": {"concurrency": args.runner_concurrency, "claim_batch": args.claim_batch},
        "push": {
            "max_in_flight": args.max_in_flight,
            "apns": {
                "key": "env:BENCH_APNS_KEY",
                "key_id": KEY_ID,
                "team_id": TEAM_ID,
                "bundle_id": TOPIC,
                "endpoint": fake.url,
                "ca_file": fake.ca_file,
            },
        },
        "log": {"level": "error"},
    }


async def pipeline(
    args: argparse.Namespace,
    url: str,
    fake: FakeApnsServer,
    pem: str,
    regs: list[tuple[str, str]],
    *,
    badge: str = "unread_threads",
    stall: bool = True,
    kind: str = PUSH_SEND,
) -> dict[str, Any]:
    insert = insert_clears if kind == PUSH_CLEAR else insert_jobs
    sections = worker_config(args, fake)
    sections["push"]["badge"] = badge
    config = structure_config(sections, env={"BENCH_APNS_KEY": pem})
    daemon = Daemon(config, database_url=url)
    postmaster = postgres_pid(url)
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        assert daemon.providers is not None
        apns = daemon.providers.get("apns")
        assert isinstance(apns, ApnsProvider)

        # Warm up: the HTTP/2 connection, the pool, the code paths.
        await trio.to_thread.run_sync(insert, url, regs, args.warmup, 0)
        with trio.fail_after(60):
            await wait_finished(daemon, args.warmup, kind)

        profiler = Profiler(args.profile) if args.profile else None
        counted = dict(daemon.runner.statistics()) if daemon.runner is not None else {}
        committed = await trio.to_thread.run_sync(insert, url, regs, args.jobs, args.warmup)
        meter = Meter(fake.pid, postmaster)
        occupancy: list[tuple[int, int]] = []

        async def sample() -> None:
            assert daemon.providers is not None and daemon.runner is not None
            while True:
                await trio.sleep(0.05)
                occupancy.append(
                    (
                        daemon.runner.statistics()["in_flight"],
                        daemon.providers.statistics().get("apns", 0),
                    )
                )

        async with trio.open_nursery() as sampler:
            sampler.start_soon(sample)
            with trio.fail_after(120):
                await wait_finished(daemon, args.warmup + args.jobs, kind)
            sampler.cancel_scope.cancel()
        elapsed = time.perf_counter() - committed
        out["cpu"] = meter.stop(args.jobs)
        if profiler is not None:
            profiler.stop()
        if daemon.runner is not None and counted:
            after = daemon.runner.statistics()
            claims = after["claims"] - counted["claims"]
            records = after["records"] - counted["records"]
            out["jobs_per_claim"] = (after["claimed"] - counted["claimed"]) / max(1, claims)
            out["results_per_record"] = (after["recorded"] - counted["recorded"]) / max(1, records)
        if occupancy:
            out["runner_in_flight_avg"] = sum(o[0] for o in occupancy) / len(occupancy)
            out["apns_in_flight_avg"] = sum(o[1] for o in occupancy) / len(occupancy)
        out["pushes_per_s"] = args.jobs / elapsed
        out["pipeline_seconds"] = elapsed
        out["delivered_total"] = daemon.metrics.registry.get_sample_value(
            "bothy_push_sends_total", {"provider": "apns", "outcome": "delivered", "app": "default"}
        )

        if not stall:
            daemon.request_shutdown()
            return out
        # Stall: the fake holds every request; memory must stay bounded.
        fake.stall()
        try:
            before, _ = rss_mb()
            start = args.warmup + args.jobs
            await trio.to_thread.run_sync(insert_jobs, url, regs, args.stall_jobs, start)
            samples: list[float] = []
            in_flight: list[int] = []
            deadline = time.perf_counter() + args.stall_seconds
            while time.perf_counter() < deadline:
                await trio.sleep(0.25)
                samples.append(rss_mb()[0])
                in_flight.append(daemon.providers.statistics().get("apns", 0))
        finally:
            fake.resume()
        out["stall_rss_before_mb"] = before
        out["stall_rss_max_mb"] = max(samples)
        out["stall_rss_last_mb"] = samples[-1]
        out["stall_in_flight_max"] = max(in_flight)
        daemon.request_shutdown()
    return out


def seed_webpush(url: str, registrations: int, endpoint: str) -> list[tuple[str, str]]:
    """People and one Web Push subscription each (its own P-256 key and auth secret)."""
    now = datetime.now(UTC)
    people = [f"web{i}" for i in range(registrations)]
    regs = [(f"wreg-{u}", u) for u in people]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        seed_people(cur, people)
        cur.executemany(
            "INSERT INTO bothy.devices (device_id, user_id, platform, state)"
            " VALUES (%s, %s, 'web', 'active')",
            [(f"browser-{u}", u) for u in people],
        )
        rows = []
        for i, (r, u) in enumerate(regs):
            point = (
                ec.generate_private_key(ec.SECP256R1())
                .public_key()
                .public_bytes(
                    serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
                )
            )
            keys = pack_keys(point, os.urandom(16))
            rows.append((r, u, f"browser-{u}", f"{endpoint}/wp/sub{i}", keys, now, now))
        cur.executemany(
            "INSERT INTO bothy.push_registrations (id, user_id, device_id, provider, token,"
            " signing_key, created_at, renewed_at)"
            " VALUES (%s, %s, %s, 'webpush', %s, %s, %s, %s)",
            rows,
        )
    return regs


def encryption_cost(samples: int = 2_000) -> dict[str, float]:
    """CPU microseconds of RFC 8291's work per push in this process: the whole
    ``encrypt`` (ephemeral key pair, ECDH, HKDF, AES-128-GCM), and its two
    elliptic-curve steps alone."""
    point = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )
    peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    auth = os.urandom(16)
    body = b'{"nid":"0190c0de-0000-7000-8000-000000000001","kind":"message","count":1}'
    start = time.process_time()
    for _ in range(samples):
        encrypt(body, point, auth)
    whole = (time.process_time() - start) / samples * 1e6
    start = time.process_time()
    for _ in range(samples):
        ec.generate_private_key(ec.SECP256R1()).exchange(ec.ECDH(), peer)
    ecdh = (time.process_time() - start) / samples * 1e6
    return {"encrypt_us": whole, "keypair_and_ecdh_us": ecdh}


async def pipeline_pair(
    args: argparse.Namespace,
    url: str,
    fake: FakeApnsServer,
    pem: str,
    regs: dict[str, list[tuple[str, str]]],
) -> list[dict[str, Any]]:
    """``--provider webpush``: one daemon with APNs and Web Push, an APNs batch and a Web
    Push batch in turn, ``--rounds`` times (see the module docstring)."""
    vapid, _public = generate_vapid_key()
    raw = worker_config(args, fake)
    raw["push"]["webpush"] = {
        "vapid_private_key": "env:BENCH_VAPID_KEY",
        "subject": "mailto:bench@example.com",
        "allowed_endpoints": ["localhost"],
        "allow_private_addresses": True,
        "ca_file": fake.ca_file,
    }
    config = structure_config(raw, env={"BENCH_APNS_KEY": pem, "BENCH_VAPID_KEY": vapid})
    daemon = Daemon(config, database_url=url)
    postmaster = postgres_pid(url)
    runs: list[dict[str, Any]] = []
    start = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        for provider in ("apns", "webpush"):  # warm up both: connections, pool, code paths
            await trio.to_thread.run_sync(insert_jobs, url, regs[provider], args.warmup, start)
            start += args.warmup
            with trio.fail_after(60):
                await wait_finished(daemon, start)
        for _ in range(args.rounds):
            for provider in ("apns", "webpush"):
                profiler = (
                    Profiler(args.profile) if args.profile and provider == "webpush" else None
                )
                committed = await trio.to_thread.run_sync(
                    insert_jobs, url, regs[provider], args.jobs, start
                )
                meter = Meter(fake.pid, postmaster)
                start += args.jobs
                with trio.fail_after(120):
                    await wait_finished(daemon, start)
                elapsed = time.perf_counter() - committed
                cpu = meter.stop(args.jobs)
                if profiler is not None:
                    profiler.stop(40)
                delivered = daemon.metrics.registry.get_sample_value(
                    "bothy_push_sends_total",
                    {"provider": provider, "outcome": "delivered", "app": "default"},
                )
                figures = {
                    "provider": provider,
                    "pushes_per_s": args.jobs / elapsed,
                    "daemon_cpu_us": cpu["own_cpu_us"],
                    "postgres_cpu_us": cpu.get("postgres_cpu_us"),
                    "fake_cpu_us": cpu["fake_cpu_us"],
                    "machine_busy_pct": cpu["machine_busy_pct"],
                    "delivered_total": delivered,
                }
                pg = figures["postgres_cpu_us"] or 0.0
                print(
                    f"{provider:8s} {figures['pushes_per_s']:8,.0f} pushes/s,"
                    f" {figures['daemon_cpu_us'] + pg:5.0f} us CPU per push ="
                    f" {figures['daemon_cpu_us']:.0f} daemon + {pg:.0f} PostgreSQL;"
                    f" fake {figures['fake_cpu_us']:.0f} us; machine"
                    f" {figures['machine_busy_pct']:.0f}% busy; {delivered:.0f} delivered so far",
                    flush=True,
                )
                runs.append(figures)
        daemon.request_shutdown()
    return runs


def report_pair(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The summary and last line of a ``--provider webpush`` run."""

    def means(provider: str) -> tuple[float, float, float, float]:
        group = [r for r in runs if r["provider"] == provider]
        pushes = sum(r["pushes_per_s"] for r in group) / len(group)
        daemon = sum(r["daemon_cpu_us"] for r in group) / len(group)
        pg = sum((r["postgres_cpu_us"] or 0.0) for r in group) / len(group)
        return pushes, daemon + pg, daemon, pg

    a_pushes, a_cpu, a_daemon, a_pg = means("apns")
    w_pushes, w_cpu, w_daemon, w_pg = means("webpush")
    crypto = encryption_cost()
    ratio = w_cpu / a_cpu if a_cpu else 0.0
    print(
        f"mean of {args.rounds} alternating rounds of {args.jobs} pushes each:"
        f" APNs {a_pushes:,.0f} pushes/s at {a_cpu:.0f} us CPU per push"
        f" ({a_daemon:.0f} daemon + {a_pg:.0f} PostgreSQL);"
        f" Web Push {w_pushes:,.0f} pushes/s at {w_cpu:.0f} us CPU per push"
        f" ({w_daemon:.0f} daemon + {w_pg:.0f} PostgreSQL)"
    )
    print(
        f"Web Push / APNs CPU per push: {ratio:.2f}x (target <= 2x); pushes/s"
        f" {w_pushes / a_pushes if a_pushes else 0:.2f}x"
    )
    print(
        f"RFC 8291 encryption per push (this process): {crypto['encrypt_us']:.0f} us,"
        f" of which the ephemeral key pair and ECDH {crypto['keypair_and_ecdh_us']:.0f} us"
    )
    _, peak = rss_mb()
    print(f"machine: {machine()}")
    report(
        "push",
        provider="webpush",
        pushes_per_s=round(w_pushes, 1),
        cpu_us_per_push=round(w_cpu, 1),
        daemon_cpu_us_per_push=round(w_daemon, 1),
        postgres_cpu_us_per_push=round(w_pg, 1),
        apns_pushes_per_s=round(a_pushes, 1),
        apns_cpu_us_per_push=round(a_cpu, 1),
        cpu_ratio_to_apns=round(ratio, 3),
        encrypt_us=round(crypto["encrypt_us"], 1),
        keypair_and_ecdh_us=round(crypto["keypair_and_ecdh_us"], 1),
        rounds=args.rounds,
        peak_rss_mb=round(peak, 1),
        fake=args.fake,
    )


def unfinished(url: str) -> int:
    """Jobs still available or running (one light query on the partial indexes)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM bothy.jobs WHERE state IN ('available', 'running')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def last_job_id(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM bothy.jobs").fetchone()
    assert row is not None
    return int(row[0])


def last_finished(url: str, after_id: int) -> datetime:
    """When the last job with an id above ``after_id`` was recorded (the database's clock)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT max(finished_at) FROM bothy.jobs WHERE id > %s", (after_id,)
        ).fetchone()
    assert row is not None and row[0] is not None
    finished: datetime = row[0]
    return finished


def failed_jobs(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM bothy.jobs WHERE state = 'failed'").fetchone()
    assert row is not None
    return int(row[0])


def node_config_file(args: argparse.Namespace, url: str, fake: FakeApnsServer, tmp: Path) -> Path:
    """The pipeline's daemon as a configuration file for ``bothy-notify run``."""
    import tomlkit

    config = worker_config(args, fake)
    config["database"]["url"] = url
    path = tmp / "node.toml"
    path.write_text(tomlkit.dumps(config), encoding="utf-8")
    return path


async def wait_drained(url: str) -> None:
    """Return once no job is available or running (the caller bounds the wait)."""
    # Other processes finish the jobs: nothing here to wait on but the database. The
    # run's end is read from the jobs' finished_at, so the poll can be slow and cheap.
    while await trio.to_thread.run_sync(unfinished, url):  # noqa: ASYNC110
        await trio.sleep(0.2)


async def command_pipeline(
    args: argparse.Namespace,
    processes: int,
    url: str,
    fake: FakeApnsServer,
    pem: str,
    regs: list[tuple[str, str]],
    config: Path,
    start: int,
) -> dict[str, Any]:
    """One pipeline run by ``bothy-notify run --processes N`` (see the docstring)."""
    node = BenchDaemon(
        config_file=config,
        log_file=config.parent / f"node-{processes}-{start}.log",
        env={"BENCH_APNS_KEY": pem},
        args=("--processes", str(processes)),
    )
    try:
        try:
            await node.start(timeout=120)
        except DaemonFailed as exc:
            raise SystemExit(str(exc)) from None
        await trio.to_thread.run_sync(insert_jobs, url, regs, args.warmup, start)
        with trio.fail_after(60):
            await wait_drained(url)
        postmaster = postgres_pid(url)
        failed_before = await trio.to_thread.run_sync(failed_jobs, url)
        nodes_cpu, fake_cpu = node.tree_cpu_seconds(), process_cpu(fake.pid)
        pg_cpu = postgres_cpu(postmaster) if postmaster else 0.0
        busy, total = machine_busy()
        before = await trio.to_thread.run_sync(last_job_id, url)
        await trio.to_thread.run_sync(insert_jobs, url, regs, args.jobs, start + args.warmup)
        committed = datetime.now(UTC)
        with trio.fail_after(120):
            await wait_drained(url)
        finished = await trio.to_thread.run_sync(last_finished, url, before)
        elapsed = (finished - committed).total_seconds()
        busy2, total2 = machine_busy()
        per = 1e6 / args.jobs
        figures: dict[str, Any] = {
            "processes": processes,
            "pushes_per_s": args.jobs / elapsed,
            "pipeline_seconds": elapsed,
            "daemon_cpu_us": (node.tree_cpu_seconds() - nodes_cpu) * per,
            "postgres_cpu_us": (postgres_cpu(postmaster) - pg_cpu) * per if postmaster else None,
            "fake_cpu_us": (process_cpu(fake.pid) - fake_cpu) * per,
            "machine_busy_pct": 100 * (busy2 - busy) / max(1.0, total2 - total),
            "failed": await trio.to_thread.run_sync(failed_jobs, url) - failed_before,
        }
    finally:
        await node.stop(timeout=60)
    return figures


async def scaling(
    args: argparse.Namespace,
    url: str,
    fake: FakeApnsServer,
    pem: str,
    regs: list[tuple[str, str]],
    tmp: Path,
) -> list[dict[str, Any]]:
    """``--rounds`` alternating runs of one and of ``--processes`` node processes."""
    config = node_config_file(args, url, fake, tmp)
    runs: list[dict[str, Any]] = []
    start = 0
    for _ in range(args.rounds):
        for processes in (1, args.processes):
            figures = await command_pipeline(args, processes, url, fake, pem, regs, config, start)
            start += args.warmup + args.jobs
            pg = figures["postgres_cpu_us"]
            print(
                f"pipeline, {processes} process{'es' if processes > 1 else ''}:"
                f" {figures['pushes_per_s']:,.0f} pushes/s,"
                f" {figures['daemon_cpu_us'] + (pg or 0):.0f} us CPU per push ="
                f" {figures['daemon_cpu_us']:.0f} in the node processes"
                f" + {pg if pg is not None else float('nan'):.0f} in PostgreSQL;"
                f" fake {figures['fake_cpu_us']:.0f} us; machine"
                f" {figures['machine_busy_pct']:.0f}% busy; {figures['failed']} failed",
                flush=True,
            )
            runs.append(figures)
    return runs


def mean(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return sum(values) / len(values) if values else None


async def main_async(args: argparse.Namespace) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    with tempfile.TemporaryDirectory(prefix="bothy-bench-push-") as tmp:
        fake = start_fake(args.fake, Path(tmp), key)
        try:
            with bench_database() as url:
                regs = await trio.to_thread.run_sync(seed, url, args.registrations)
                if args.provider == "webpush":
                    endpoint = fake.url.replace("127.0.0.1", "localhost")
                    web = await trio.to_thread.run_sync(
                        seed_webpush, url, args.registrations, endpoint
                    )
                    pair = await pipeline_pair(args, url, fake, pem, {"apns": regs, "webpush": web})
                    report_pair(args, pair)
                    return
                if args.badge:
                    await trio.to_thread.run_sync(seed_unread, url, regs)
                    runs = []
                    for _ in range(args.rounds):
                        for mode in ("off", "unread_threads"):
                            figures = await pipeline(
                                args, url, fake, pem, regs, badge=mode, stall=False
                            )
                            runs.append({"badge": mode, **figures})
                            print(f"  push.badge = {mode}: {per_push_us(figures):.0f} us/push")
                    report_badge(args, runs)
                    return
                if args.quiet:
                    runs = []
                    for _ in range(args.rounds):
                        for mode in QUIET_MODES:
                            await trio.to_thread.run_sync(set_quiet, url, regs, mode)
                            figures = await pipeline(args, url, fake, pem, regs, stall=False)
                            runs.append({"quiet": mode, **figures})
                            print(f"  quiet hours {mode}: {per_push_us(figures):.0f} us/push")
                    report_quiet(args, runs)
                    return
                if args.clear:
                    runs = []
                    for _ in range(args.rounds):
                        for kind in (PUSH_SEND, PUSH_CLEAR):
                            figures = await pipeline(
                                args, url, fake, pem, regs, stall=False, kind=kind
                            )
                            runs.append({"kind": kind, **figures})
                            print(f"  {kind}: {per_push_us(figures):.0f} us/push", flush=True)
                    report_clear(args, runs)
                    return
                bare_figures = await run_client("pycurl", fake, pem, args.bare, args.concurrency)
                bare = bare_figures["requests_per_s"]
                print(
                    f"bare HTTP/2 loop (pycurl, the provider's client): {bare:,.0f} requests/s"
                    f" ({args.bare} requests, {args.concurrency} tasks, {args.fake} fake)",
                    flush=True,
                )
                if args.processes is not None:
                    runs = await scaling(args, url, fake, pem, regs, Path(tmp))
                else:
                    figures = await pipeline(args, url, fake, pem, regs)
        finally:
            fake.close()
    if args.processes is not None:
        report_scaling(args, bare, bare_figures, runs)
        return
    pushes = figures["pushes_per_s"]
    ratio = pushes / bare
    cpu = figures["cpu"]
    daemon_us = cpu["own_cpu_us"]
    postgres_us = cpu.get("postgres_cpu_us")
    per_push = daemon_us + (postgres_us or 0.0)
    _, peak = rss_mb()
    print(
        f"pipeline: {pushes:,.0f} pushes/s ({args.jobs} push_send jobs through the runner, "
        f"{figures['pipeline_seconds']:.2f} s)"
    )
    print(f"ratio pipeline/bare: {ratio:.2f}")
    print(
        f"pipeline occupancy: {figures.get('runner_in_flight_avg', 0):.0f} jobs in the runner,"
        f" {figures.get('apns_in_flight_avg', 0):.0f} APNs sends in flight on average;"
        f" {figures.get('jobs_per_claim', 0):.0f} jobs per claim,"
        f" {figures.get('results_per_record', 0):.0f} results per recording transaction"
    )
    print(
        f"bare: {bare_figures['cpu_us_per_request']:.0f} us CPU per request in this process,"
        f" {bare_figures['fake_cpu_us_per_request']:.0f} us in the fake;"
        f" machine {bare_figures['machine_busy_pct']:.0f}% busy"
    )
    postgres_text = f"{postgres_us:.0f} us" if postgres_us is not None else "not measured"
    print(
        f"pipeline: {per_push:.0f} us CPU per push = {daemon_us:.0f} us in the daemon"
        f" + {postgres_text} in PostgreSQL; {cpu['fake_cpu_us']:.0f} us in the fake;"
        f" machine {cpu['machine_busy_pct']:.0f}% busy"
    )
    print(
        f"stall ({args.stall_seconds:.0f} s, {args.stall_jobs} jobs waiting): RSS "
        f"{figures['stall_rss_before_mb']:.0f} MiB before, at most "
        f"{figures['stall_rss_max_mb']:.0f} MiB, {figures['stall_rss_last_mb']:.0f} MiB at the "
        f"end; at most {figures['stall_in_flight_max']} APNs sends in flight "
        f"(push.max_in_flight = {args.max_in_flight})"
    )
    print(f"machine: {machine()}")
    report(
        "push",
        pushes_per_s=round(pushes, 1),
        bare_per_s=round(bare, 1),
        ratio=round(ratio, 3),
        peak_rss_mb=round(peak, 1),
        cpu_us_per_push=round(per_push, 1),
        daemon_cpu_us_per_push=round(daemon_us, 1),
        postgres_cpu_us_per_push=None if postgres_us is None else round(postgres_us, 1),
        processes=1,
        fake=args.fake,
    )


def per_push_us(figures: dict[str, Any]) -> float:
    """CPU per push of one pipeline run: the daemon's and PostgreSQL's."""
    cpu = figures["cpu"]
    return float(cpu["own_cpu_us"] + (cpu.get("postgres_cpu_us") or 0.0))


def report_badge(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The badge's cost: CPU per push with ``push.badge`` off and on, alternated."""

    def means(mode: str) -> tuple[float, float, float]:
        group = [r for r in runs if r["badge"] == mode]
        daemon = sum(r["cpu"]["own_cpu_us"] for r in group) / len(group)
        postgres = sum(r["cpu"].get("postgres_cpu_us") or 0.0 for r in group) / len(group)
        rate = sum(r["pushes_per_s"] for r in group) / len(group)
        return daemon, postgres, rate

    off_daemon, off_pg, off_rate = means("off")
    on_daemon, on_pg, on_rate = means("unread_threads")
    off_total, on_total = off_daemon + off_pg, on_daemon + on_pg
    ratio = on_total / off_total
    print(
        f"badge cost ({args.rounds} alternations of {args.jobs} pushes, {BADGE_THREADS} followed"
        f" threads per person, {BADGE_THREADS // 2} unread):"
    )
    print(
        f"  push.badge = off:            {off_total:.0f} us CPU per push"
        f" ({off_daemon:.0f} daemon + {off_pg:.0f} PostgreSQL), {off_rate:,.0f} pushes/s"
    )
    print(
        f"  push.badge = unread_threads: {on_total:.0f} us CPU per push"
        f" ({on_daemon:.0f} daemon + {on_pg:.0f} PostgreSQL), {on_rate:,.0f} pushes/s"
    )
    print(f"  ratio with/without the badge: {ratio:.2f} (target: below 2)")
    print(f"machine: {machine()}")
    report(
        "push_badge",
        cpu_us_per_push_badge_off=round(off_total, 1),
        cpu_us_per_push_badge_on=round(on_total, 1),
        postgres_cpu_us_per_push_badge_off=round(off_pg, 1),
        postgres_cpu_us_per_push_badge_on=round(on_pg, 1),
        badge_cost_us_per_push=round(on_total - off_total, 1),
        ratio=round(ratio, 3),
        pushes_per_s_badge_off=round(off_rate, 1),
        pushes_per_s_badge_on=round(on_rate, 1),
        rounds=args.rounds,
        jobs=args.jobs,
        fake=args.fake,
    )


def report_clear(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The clear push's cost beside a hint's push, alternated in fresh daemons."""

    def means(kind: str) -> tuple[float, float, float]:
        group = [r for r in runs if r["kind"] == kind]
        daemon = sum(r["cpu"]["own_cpu_us"] for r in group) / len(group)
        postgres = sum(r["cpu"].get("postgres_cpu_us") or 0.0 for r in group) / len(group)
        rate = sum(r["pushes_per_s"] for r in group) / len(group)
        return daemon, postgres, rate

    push_daemon, push_pg, push_rate = means(PUSH_SEND)
    clear_daemon, clear_pg, clear_rate = means(PUSH_CLEAR)
    push_total, clear_total = push_daemon + push_pg, clear_daemon + clear_pg
    print(f"clear push cost ({args.rounds} alternations of {args.jobs} jobs each):")
    print(
        f"  notify.push_send:  {push_total:.0f} us CPU per push"
        f" ({push_daemon:.0f} daemon + {push_pg:.0f} PostgreSQL), {push_rate:,.0f} pushes/s"
    )
    print(
        f"  notify.push_clear: {clear_total:.0f} us CPU per clear push"
        f" ({clear_daemon:.0f} daemon + {clear_pg:.0f} PostgreSQL), {clear_rate:,.0f} pushes/s"
    )
    print(f"machine: {machine()}")
    report(
        "push_clear",
        cpu_us_per_clear_push=round(clear_total, 1),
        daemon_cpu_us_per_clear_push=round(clear_daemon, 1),
        postgres_cpu_us_per_clear_push=round(clear_pg, 1),
        cpu_us_per_push=round(push_total, 1),
        ratio=round(clear_total / push_total, 3),
        clear_pushes_per_s=round(clear_rate, 1),
        pushes_per_s=round(push_rate, 1),
        rounds=args.rounds,
        jobs=args.jobs,
        fake=args.fake,
    )


def report_quiet(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """The quiet-hours check's cost: CPU per push with nobody quiet-hours-set,
    everybody set but not quiet, and everybody held, alternated."""
    figures: dict[str, tuple[float, float, float]] = {}
    for mode in QUIET_MODES:
        group = [r for r in runs if r["quiet"] == mode]
        daemon = sum(r["cpu"]["own_cpu_us"] for r in group) / len(group)
        postgres = sum(r["cpu"].get("postgres_cpu_us") or 0.0 for r in group) / len(group)
        rate = sum(r["pushes_per_s"] for r in group) / len(group)
        figures[mode] = (daemon, postgres, rate)
    base = sum(figures["none"][:2])
    print(f"quiet hours' cost ({args.rounds} alternations of {args.jobs} push_send jobs):")
    for mode, (daemon, postgres, rate) in figures.items():
        print(
            f"  {mode:>4}: {daemon + postgres:.0f} us CPU per push ({daemon:.0f} daemon"
            f" + {postgres:.0f} PostgreSQL), {rate:,.0f} jobs/s,"
            f" ratio {(daemon + postgres) / base:.2f}"
        )
    print(f"machine: {machine()}")
    report(
        "push_quiet",
        **{
            f"cpu_us_per_push_{mode}": round(daemon + postgres, 1)
            for mode, (daemon, postgres, _rate) in figures.items()
        },
        **{
            f"postgres_cpu_us_per_push_{mode}": round(postgres, 1)
            for mode, (_daemon, postgres, _rate) in figures.items()
        },
        ratio_set=round(sum(figures["set"][:2]) / base, 3),
        ratio_held=round(sum(figures["held"][:2]) / base, 3),
        ratio_snooze60=round(sum(figures["snooze60"][:2]) / base, 3),
        ratio_dst14=round(sum(figures["dst14"][:2]) / base, 3),
        ratio_dst14_to_snooze60=round(sum(figures["dst14"][:2]) / sum(figures["snooze60"][:2]), 3),
        rounds=args.rounds,
        jobs=args.jobs,
        fake=args.fake,
    )


def report_scaling(
    args: argparse.Namespace,
    bare: float,
    bare_figures: dict[str, Any],
    runs: list[dict[str, Any]],
) -> None:
    """The summary and last line of a ``--processes`` run."""
    single = [r for r in runs if r["processes"] == 1]
    multi = [r for r in runs if r["processes"] == args.processes]

    def figures(group: list[dict[str, Any]]) -> tuple[float, float, float, float | None]:
        pushes = mean(group, "pushes_per_s") or 0.0
        daemon = mean(group, "daemon_cpu_us") or 0.0
        pg = mean(group, "postgres_cpu_us")
        return pushes, daemon + (pg or 0.0), daemon, pg

    s_pushes, s_cpu, _, _ = figures(single)
    m_pushes, m_cpu, m_daemon, m_pg = figures(multi)
    ratio = m_pushes / s_pushes if s_pushes else 0.0
    print(
        f"bare: {bare_figures['cpu_us_per_request']:.0f} us CPU per request in this process,"
        f" {bare_figures['fake_cpu_us_per_request']:.0f} us in the fake"
    )
    print(
        f"mean of {args.rounds} alternating rounds: 1 process {s_pushes:,.0f} pushes/s at"
        f" {s_cpu:.0f} us per push; {args.processes} processes {m_pushes:,.0f} pushes/s at"
        f" {m_cpu:.0f} us per push ({m_pushes / args.processes:,.0f}/s per process);"
        f" scaling {ratio:.2f}x"
    )
    _, peak = rss_mb()
    print(f"machine: {machine()}")
    report(
        "push",
        pushes_per_s=round(m_pushes, 1),
        bare_per_s=round(bare, 1),
        ratio=round(m_pushes / bare, 3),
        peak_rss_mb=round(peak, 1),
        cpu_us_per_push=round(m_cpu, 1),
        daemon_cpu_us_per_push=round(m_daemon, 1),
        postgres_cpu_us_per_push=None if m_pg is None else round(m_pg, 1),
        processes=args.processes,
        fake=args.fake,
        single_pushes_per_s=round(s_pushes, 1),
        single_cpu_us_per_push=round(s_cpu, 1),
        scaling=round(ratio, 3),
        rounds=args.rounds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", choices=("nginx", "python"), default="nginx")
    parser.add_argument("--jobs", type=int, default=12_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--bare", type=int, default=8_000)
    parser.add_argument("--registrations", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=256, help="bare loop tasks")
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--runner-concurrency", type=int, default=512)
    parser.add_argument("--claim-batch", type=int, default=200)
    parser.add_argument("--pool", type=int, default=10)
    parser.add_argument("--stall-jobs", type=int, default=5_000)
    parser.add_argument("--stall-seconds", type=float, default=12.0)
    parser.add_argument("--profile", metavar="FILE", help="py-spy the pipeline into FILE")
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run the pipeline as `bothy-notify run --processes 1` and `--processes N`, in turn",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternations with --processes or --provider"
    )
    parser.add_argument(
        "--provider",
        choices=("apns", "webpush"),
        default="apns",
        help="webpush: Web Push and APNs batches in turn in one daemon (nginx fake)",
    )
    parser.add_argument(
        "--badge",
        action="store_true",
        help="the badge's cost: --rounds alternations of push.badge off and unread_threads",
    )
    parser.add_argument(
        "--clear",
        action="store_true",
        help="the clear push's cost: --rounds alternations of push_send and push_clear batches",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="the quiet-hours check's cost: --rounds alternations of nobody set, set but"
        " not quiet, held, 60 people snoozed, and 60 with the pathological schedule",
    )
    args = parser.parse_args()
    if args.quiet and (
        args.provider != "apns" or args.processes is not None or args.badge or args.clear
    ):
        parser.error("--quiet measures the in-process APNs pipeline (without --badge, --clear)")
    if args.clear and (args.provider != "apns" or args.processes is not None or args.badge):
        parser.error("--clear measures the in-process APNs pipeline (without --badge)")
    if args.badge and (args.provider != "apns" or args.processes is not None):
        parser.error("--badge measures the in-process APNs pipeline")
    if args.provider == "webpush" and (args.fake != "nginx" or args.processes is not None):
        parser.error("--provider webpush runs against the nginx fake, in one process")
    if args.processes is not None and args.processes < 2:
        parser.error("--processes: at least 2 (1 is the comparison every round makes)")
    if args.processes is not None and args.profile:
        parser.error("--profile profiles the in-process pipeline; leave out --processes")
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
