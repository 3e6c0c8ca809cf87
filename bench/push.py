"""Benchmark: ``notify.push_send`` jobs through the real runner to a fake APNs.

The fake APNs runs in its own process (``bench/_fakes.py``): ``--fake nginx``
(the default: nginx with HTTP/2 and TLS answering APNs-shaped 200s at C speed,
installed from Debian's packages when missing) or ``--fake python``
(``tests/push/fake_apns.py``, which checks every request the way Apple does
and costs about 0.5 ms of CPU per request). In one run:

1. bare: a loop of ``--concurrency`` tasks posting the provider's exact
   requests to the same fake with the same client the provider uses
   (``bench/http2_clients.py``'s ``pycurl`` loop): requests/s;
2. pipeline: ``--jobs`` push_send jobs inserted at once into the embedded
   PostgreSQL, run by a real daemon (role worker: job runner, PushSendHandler,
   the APNs provider built from ``[push.apns]``, per-provider limiter,
   results recorded in batches): pushes/s from the insert's commit to the last
   job recorded, and the CPU per push of this process (the daemon) and of
   PostgreSQL's processes;
3. stall: the fake stops answering; ``--stall-jobs`` more jobs are inserted and
   the process's resident memory is sampled for ``--stall-seconds`` (in-flight
   sends stay bounded by ``push.max_in_flight``), then the fake answers again.

Prints pushes/s, bare/s, their ratio, CPU per push, the memory figures, and a
last JSON line.

Usage: .venv/bin/python bench/push.py [--fake nginx|python] [--jobs N] [--bare N]
       [--registrations R] [--concurrency C] [--max-in-flight M] [--stall-seconds S]
       [--profile FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import Meter, bench_database, machine, postgres_pid, report  # noqa: E402
from bench._fakes import KEY_ID, TEAM_ID, TOPIC, FakeApnsServer, start_fake  # noqa: E402
from bench.http2_clients import run_client  # noqa: E402
from bothy_notify.config import structure_config  # noqa: E402
from bothy_notify.kernel.clock import to_unix_micros  # noqa: E402
from bothy_notify.notify.jobs.args import PUSH_SEND, PushSendArgs  # noqa: E402
from bothy_notify.push.apns import ApnsProvider  # noqa: E402
from bothy_notify.wiring import Daemon  # noqa: E402


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    fields: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def seed(url: str, registrations: int) -> list[tuple[str, str]]:
    """People, a thread they can read, and one APNs registration each."""
    now = datetime.now(UTC)
    people = [f"user{i}" for i in range(registrations)]
    regs = [(f"reg-{u}", u) for u in people]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO bothy.users (user_id, kind, active) VALUES (%s, 'human', true)",
            [(u,) for u in people],
        )
        cur.executemany(
            "INSERT INTO bothy.members (scope_id, user_id) VALUES ('space', %s)",
            [(u,) for u in people],
        )
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


def finished(daemon: Daemon) -> int:
    """push_send jobs recorded as finished by this daemon (its own counter: no polling load)."""
    total = 0.0
    for metric in daemon.metrics.jobs_finished.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("kind") == PUSH_SEND:
                total += sample.value
    return int(total)


async def wait_finished(daemon: Daemon, target: int) -> None:
    """Return once ``target`` push_send jobs are recorded (the caller bounds the wait)."""
    # The runner has no completion event to wait on; polling its in-process counter is free.
    while finished(daemon) < target:  # noqa: ASYNC110
        await trio.sleep(0.01)


class Profiler:
    """``py-spy record`` on this process while the pipeline runs (``--profile FILE``):
    collapsed stacks in FILE, and the top entries printed."""

    def __init__(self, path: str) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.path = path
        self.proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(os.getpid()),
                "--threads",
                "--format",
                "raw",
                "--rate",
                "250",
                "--output",
                path,
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        print_profile(self.path)


def print_profile(path: str, top: int = 25) -> None:
    """The functions with the most samples in a collapsed-stack file: own and total."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
            for f in stack.split(";")
        ]
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    print(f"profile: {samples} samples in {path}")
    print("  own %  function (file)")
    for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / samples:5.1f}  {name}")
    print("  total %  function (file)")
    for name, n in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / samples:5.1f}  {name}")


async def pipeline(
    args: argparse.Namespace,
    url: str,
    fake: FakeApnsServer,
    pem: str,
    regs: list[tuple[str, str]],
) -> dict[str, Any]:
    config = structure_config(
        {
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
        },
        env={"BENCH_APNS_KEY": pem},
    )
    daemon = Daemon(config, database_url=url)
    postmaster = postgres_pid(url)
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        assert daemon.providers is not None
        apns = daemon.providers.get("apns")
        assert isinstance(apns, ApnsProvider)

        # Warm up: the HTTP/2 connection, the pool, the code paths.
        await trio.to_thread.run_sync(insert_jobs, url, regs, args.warmup, 0)
        with trio.fail_after(60):
            await wait_finished(daemon, args.warmup)

        profiler = Profiler(args.profile) if args.profile else None
        committed = await trio.to_thread.run_sync(insert_jobs, url, regs, args.jobs, args.warmup)
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
                await wait_finished(daemon, args.warmup + args.jobs)
            sampler.cancel_scope.cancel()
        elapsed = time.perf_counter() - committed
        out["cpu"] = meter.stop(args.jobs)
        if profiler is not None:
            profiler.stop()
        if occupancy:
            out["runner_in_flight_avg"] = sum(o[0] for o in occupancy) / len(occupancy)
            out["apns_in_flight_avg"] = sum(o[1] for o in occupancy) / len(occupancy)
        out["pushes_per_s"] = args.jobs / elapsed
        out["pipeline_seconds"] = elapsed
        out["delivered_total"] = daemon.metrics.registry.get_sample_value(
            "bothy_push_sends_total", {"provider": "apns", "outcome": "delivered"}
        )

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
                bare_figures = await run_client("pycurl", fake, pem, args.bare, args.concurrency)
                bare = bare_figures["requests_per_s"]
                print(
                    f"bare HTTP/2 loop (pycurl, the provider's client): {bare:,.0f} requests/s"
                    f" ({args.bare} requests, {args.concurrency} tasks, {args.fake} fake)",
                    flush=True,
                )
                figures = await pipeline(args, url, fake, pem, regs)
        finally:
            fake.close()
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
        f" {figures.get('apns_in_flight_avg', 0):.0f} APNs sends in flight on average"
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
    args = parser.parse_args()
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
