"""Benchmark: what one PostgreSQL primary on this machine takes in writes (the
ceiling of ``docs/scaling.md``), with ``pgbench`` (the one pgserver ships, the same
16.2 as the embedded server) against a migrated database on the embedded server.

Each script runs ``--seconds`` with ``--clients`` connections on the real
``bothy.jobs`` table (its five indexes, the hottest table of a deployment) and
the standard TPC-B-like test for reference:

- ``insert_1``: one job row per transaction (a single-event append or a lone
  job: commit-bound);
- ``insert_100``: 100 job rows per transaction, one statement (what a round or a
  runner's batch writes);
- ``update_100``: 100 job rows updated by key per transaction (a claim or a
  completion of a batch);
- ``copy``: the job rows in COPY's binary format from one connection
  (``bench/decide.py``'s bare binary COPY);
- ``tpcb``: ``pgbench -b tpcb-like`` at scale 10 (five statements per
  transaction: three updates, a select, an insert).

For each: transactions/s, rows written per second, and PostgreSQL's CPU per
row (the postmaster and its children, from ``/proc``): rows/s per busy core is
what ``bench/capacity.py`` scales to a bigger primary. The durability is the
server's default (``fsync`` and ``synchronous_commit`` on).

Usage: .venv/bin/python bench/pg_ceiling.py [--seconds S] [--clients C]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, postgres_cpu, postgres_pid, report
from bench.decide import bare_binary_copy

JOB = (
    "INSERT INTO bothy.jobs (kind, args, scheduled_at, max_attempts, created_at)"
    " SELECT 'notify.push_send', jsonb_build_object('nid', gen_random_uuid()::text,"
    " 'user_id', 'user' || g, 'registration_id', 'reg-user' || g, 'kind', 'message',"
    " 'count', 1, 'quiet', 0, 'due_at', 0, 'appended_at', 0, 'release_seq', 0,"
    " 'thread_id', 't1', 'message_id', 'm1'), now(), 5, now()"
)
SCRIPTS = {
    "insert_1": (f"{JOB} FROM generate_series(1, 1) g;\n", 1),
    "insert_100": (f"{JOB} FROM generate_series(1, 100) g;\n", 100),
    "update_100": (
        "\\set id random(1, :maxid)\n"
        "UPDATE bothy.jobs SET state = 'running', attempt = attempt + 1,"
        " claim = claim + 1, lease_until = now() WHERE id BETWEEN :id AND :id + 99;\n",
        100,
    ),
}


def pgbench() -> str:
    import pgserver

    return str(Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench")


def settled_cpu(postmaster: int) -> float:
    """PostgreSQL's CPU once the backends of a finished pgbench are gone: a backend
    that has exited but is not reaped yet is in neither the live children nor the
    postmaster's children's times (a reading at once missed some of them)."""
    last = postgres_cpu(postmaster)
    for _ in range(20):
        time.sleep(0.5)
        now = postgres_cpu(postmaster)
        if now - last < 0.02:
            return now
        last = now
    return last


def run(args: list[str], postmaster: int | None) -> tuple[float, float]:
    """Run pgbench; return (transactions/s, PostgreSQL CPU seconds)."""
    before = postgres_cpu(postmaster) if postmaster else 0.0
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    cpu = (settled_cpu(postmaster) - before) if postmaster else 0.0
    match = re.search(r"tps = ([\d.]+)", out)
    if match is None:
        raise SystemExit(f"pgbench printed no tps:\n{out}")
    return float(match.group(1)), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print(f"machine: {machine()}, load {os.getloadavg()[0]:.2f}")
    figures: dict[str, dict[str, float]] = {}
    common = ["-n", "-c", str(args.clients), "-j", "2", "-T", str(args.seconds)]
    with bench_database() as url, tempfile.TemporaryDirectory() as tmp:
        postmaster = postgres_pid(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(JOB + " FROM generate_series(1, 200000) g")
            conn.execute("VACUUM ANALYZE bothy.jobs")
        for name, (script, rows) in SCRIPTS.items():
            path = Path(tmp) / f"{name}.sql"
            path.write_text(script)
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT max(id) - 100 FROM bothy.jobs").fetchone()
            maxid = int(row[0]) if row and row[0] else 1
            tps, cpu = run(
                [pgbench(), *common, "-D", f"maxid={maxid}", "-f", str(path), url], postmaster
            )
            total = tps * rows * args.seconds
            figures[name] = {
                "tps": round(tps),
                "rows_per_s": round(tps * rows),
                "postgres_cpu_us_per_row": round(cpu / total * 1e6, 2) if total else 0.0,
            }
            print(
                f"{name}: {tps:,.0f} transactions/s, {tps * rows:,.0f} rows/s,"
                f" {figures[name]['postgres_cpu_us_per_row']} us of PostgreSQL CPU per row"
            )
        copy_rows = 200_000
        timed = bare_binary_copy(url, copy_rows, postmaster)
        figures["copy"] = {
            "rows_per_s": round(copy_rows / timed.wall),
            "postgres_cpu_us_per_row": round(timed.pg_cpu / copy_rows * 1e6, 2),
        }
        print(
            f"copy: {copy_rows / timed.wall:,.0f} rows/s,"
            f" {figures['copy']['postgres_cpu_us_per_row']} us of PostgreSQL CPU per row"
        )
        subprocess.run(
            [pgbench(), "-i", "-q", "-s", "10", url], capture_output=True, check=True, text=True
        )
        tps, cpu = run([pgbench(), *common, "-b", "tpcb-like", url], postmaster)
        figures["tpcb"] = {
            "tps": round(tps),
            "postgres_cpu_us_per_transaction": round(cpu / (tps * args.seconds) * 1e6, 1),
        }
        print(f"tpcb-like (scale 10): {tps:,.0f} transactions/s")
    report("pg_ceiling", clients=args.clients, seconds=args.seconds, **figures)


if __name__ == "__main__":
    main()
