"""Benchmark: topic mode's dispatch in the consumer round.

Sets up T topics with S subscribers each (recipients and subscriptions written
straight to the tables), of which a share holds the sender's key for the
present epoch (the sender's own devices) and the rest keys of their own; then
appends E ``envelope.published`` events round-robin over the topics through
``bothy.append_event``, each signed with its topic's sender key, and times the
real round (``ConsumerRound._round_once`` on its dedicated connection) until
the log is drained. Every (envelope, subscription) is one delivery decided:
suppressed (the sender's own) or a ``topics.push_send`` job. Prints deliveries
decided/s, the suppressed count against the exact expectation, and peak
memory (Python allocations during the round, and the process's peak RSS).

For comparison it also times the same HMAC checks done in Python
(``hmac.digest`` per delivery, data already in memory): the lower bound of
a Python implementation of the check, before any row has left the database.

Usage: .venv/bin/python bench/topics.py [--envelopes E] [--topics T]
       [--subscribers S] [--own-share F] [--data-bytes B] [--batch N]
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import resource
import sys
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    bench_database,
    machine,
    machine_busy,
    postgres_cpu,
    postgres_pid,
    process_cpu,
    report,
)
from bothy_notify.config import LiveConfig, structure_config
from bothy_notify.kernel.clock import SystemClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.kernel.presence import NoPresence
from bothy_notify.notify.planner import RoundOutcome
from bothy_notify.notify.round import ConsumerRound
from bothy_notify.notify.routes import FailClosedRoutes
from bothy_notify.store.db import connect_dedicated
from bothy_notify.topics.model import b64, epoch_of, hmac_pads


def seed(
    url: str, *, envelopes: int, topics: int, subscribers: int, own: int, data_bytes: int
) -> list[tuple[bytes, bytes, list[bytes]]]:
    """Recipients, subscriptions and envelopes. Returns, per envelope, its data, its
    sender_hmac and the keys its subscriptions hold (for the Python comparison)."""
    now = datetime.now(UTC)
    base = epoch_of(now) - 1
    topic_ids = [b"\x00" + os.urandom(16) for _ in range(topics)]
    sender_keys = {t: os.urandom(42) for t in topic_ids}
    held: dict[bytes, list[bytes]] = {}
    recipients: list[tuple[bytes, bytes]] = []
    subs: list[tuple[bytes, bytes, int, bytes]] = []
    for topic in topic_ids:
        held[topic] = []
        for i in range(subscribers):
            rid = os.urandom(32)
            key = sender_keys[topic] if i < own else os.urandom(42)
            held[topic].append(key)
            recipients.append((rid, os.urandom(32)))
            subs.append((rid, topic, base, hmac_pads(key)))
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bothy.topic_recipients (recipient_id, secret_hash, channel,"
                " delivery, topic_count, created_at, renewed_at)"
                " VALUES (%s, %s, 'fake', 'bench-token', 1, %s, %s)",
                [(rid, h, now, now) for rid, h in recipients],
            )
            cur.executemany(
                "INSERT INTO bothy.topic_subscriptions (recipient_id, topic, since_xid,"
                " include_commits, hmac_epoch_base, hmac_pads_0, hmac_pads_1, hmac_pads_2)"
                " VALUES (%s, %s, '1', false, %s, %s, %s, %s)",
                [(rid, t, b, p, p, p) for rid, t, b, p in subs],
            )
        conn.commit()
        out: list[tuple[bytes, bytes, list[bytes]]] = []
        payloads: list[str] = []
        for n in range(envelopes):
            topic = topic_ids[n % topics]
            data = os.urandom(data_bytes)
            mac = hmac.digest(sender_keys[topic], data, "sha256")
            out.append((data, mac, held[topic]))
            payloads.append(
                json.dumps(
                    {
                        "topic": b64(topic),
                        "kind": "application",
                        "should_push": True,
                        "sender_hmac": b64(mac),
                        "data": b64(data),
                    }
                )
            )
        started = time.perf_counter()
        for i in range(0, len(payloads), 1000):
            chunk = payloads[i : i + 1000]
            conn.execute(
                "SELECT bothy.append_event('envelope.published', p::jsonb)"
                " FROM unnest(%s::text[]) WITH ORDINALITY AS e(p, n) ORDER BY n",
                (chunk,),
            )
            conn.commit()
        elapsed = time.perf_counter() - started
    print(f"appended {envelopes} envelopes in {elapsed:.2f}s")
    return out


@dataclass
class RoundRun:
    """What draining the log took: wall seconds, CPU seconds of this process and of
    PostgreSQL (every server process), the share of the machine busy meanwhile."""

    elapsed: float
    consumed: int
    outcome: RoundOutcome
    peak_bytes: int
    own_cpu: float
    postgres_cpu: float
    machine_busy_pct: float


def run_round(url: str, batch: int) -> RoundRun:
    """Drain the log with the real round."""
    config = structure_config(
        {"server": {"role": "worker"}, "notify": {"batch_size": batch}}, env={}
    )
    total = RoundOutcome()

    def keep(outcome: RoundOutcome) -> None:
        t, o = total.topics, outcome.topics
        t.envelopes += o.envelopes
        t.deliveries += o.deliveries
        t.jobs += o.jobs
        t.pages += o.pages
        t.largest_page = max(t.largest_page, o.largest_page)
        t.suppressed.update(o.suppressed)

    consumer = ConsumerRound(
        database_url=url,
        config=LiveConfig(config),
        clock=SystemClock(),
        presence=NoPresence(),
        live=FailClosedRoutes(),
        metrics=Metrics(),
        before_commit=keep,
    )
    conn = connect_dedicated(url)
    consumed = 0
    postmaster = postgres_pid(url)
    pg_before = postgres_cpu(postmaster) if postmaster else 0.0
    own_before = process_cpu()
    busy_before, total_before = machine_busy()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        while True:
            n, blocked = consumer._round_once(conn)
            consumed += n
            if n == 0 and not blocked:
                break
    finally:
        elapsed = time.perf_counter() - started
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        own = process_cpu() - own_before
        pg = (postgres_cpu(postmaster) - pg_before) if postmaster else 0.0
        busy, total_jiffies = machine_busy()
        conn.close()
    busy_pct = 100 * (busy - busy_before) / max(1.0, total_jiffies - total_before)
    return RoundRun(elapsed, consumed, total, peak, own, pg, busy_pct)


def python_hmac(deliveries: list[tuple[bytes, bytes, list[bytes]]]) -> tuple[float, int]:
    """The same checks in Python, data and keys already in memory."""
    suppressed = 0
    started = time.perf_counter()
    for data, mac, keys in deliveries:
        for key in keys:
            if hmac.compare_digest(hmac.digest(key, data, "sha256"), mac):
                suppressed += 1
    return time.perf_counter() - started, suppressed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--envelopes", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--subscribers", type=int, default=100, help="per topic")
    parser.add_argument("--own-share", type=float, default=0.2, help="the sender's own share")
    parser.add_argument("--data-bytes", type=int, default=1024, help="envelope data size")
    parser.add_argument("--batch", type=int, default=500, help="notify.batch_size")
    args = parser.parse_args()
    own = round(args.subscribers * args.own_share)
    print(f"machine: {machine()}")
    with bench_database() as url:
        checks = seed(
            url,
            envelopes=args.envelopes,
            topics=args.topics,
            subscribers=args.subscribers,
            own=own,
            data_bytes=args.data_bytes,
        )
        run = run_round(url, args.batch)
        elapsed, consumed, outcome, peak = run.elapsed, run.consumed, run.outcome, run.peak_bytes
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM bothy.jobs WHERE kind = 'topics.push_send'"
            ).fetchone()
            jobs = int(row[0]) if row else 0
    py_elapsed, py_suppressed = python_hmac(checks)
    topics = outcome.topics
    deliveries = topics.deliveries
    suppressed = sum(topics.suppressed.values())
    expected = args.envelopes * own
    per_s = deliveries / elapsed if elapsed else 0.0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"round: {consumed} envelopes in {elapsed:.2f}s -> {deliveries} deliveries decided"
        f" ({per_s:,.0f}/s) in {topics.pages} pages (largest {topics.largest_page})"
    )
    cpu = run.own_cpu + run.postgres_cpu
    per_cpu_s = deliveries / cpu if cpu else 0.0
    print(
        f"  CPU: this process {run.own_cpu:.2f}s, PostgreSQL {run.postgres_cpu:.2f}s"
        f" -> {per_cpu_s:,.0f} deliveries per CPU second"
        f" (machine {run.machine_busy_pct:.0f}% busy meanwhile)"
    )
    print(f"  suppressed {suppressed} (expected exactly {expected}), jobs {jobs}")
    print(
        f"  peak Python allocations during the round: {peak / 1024:,.0f} KiB;"
        f" process peak RSS {rss_mib:,.0f} MiB"
    )
    print(
        f"the same {deliveries} HMAC checks in Python (data in memory): {py_elapsed:.2f}s"
        f" ({deliveries / py_elapsed:,.0f}/s), {py_suppressed} suppressed"
    )
    report(
        "topics",
        deliveries_per_s=round(per_s),
        deliveries_per_cpu_s=round(per_cpu_s),
        own_cpu_s=round(run.own_cpu, 2),
        postgres_cpu_s=round(run.postgres_cpu, 2),
        machine_busy_pct=round(run.machine_busy_pct),
        deliveries=deliveries,
        suppressed=suppressed,
        suppressed_expected=expected,
        suppressed_exact=suppressed == expected and py_suppressed == expected,
        jobs=jobs,
        pages=topics.pages,
        largest_page=topics.largest_page,
        peak_python_kib=round(peak / 1024),
        peak_rss_mib=round(rss_mib),
        python_hmac_checks_per_s=round(deliveries / py_elapsed) if py_elapsed else 0,
        envelopes=args.envelopes,
        subscribers=args.subscribers,
        data_bytes=args.data_bytes,
    )


if __name__ == "__main__":
    main()
