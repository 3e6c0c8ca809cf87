"""Benchmark: ``notify.push_send`` jobs through the real runner to a fake APNs.

The fake APNs (``tests/push/fake_apns.py``: HTTP/2 over TLS, checking the
provider JWT, headers and body) runs in a separate process. In one run:

1. bare: an httpx HTTP/2 loop (one client, ``--concurrency`` tasks) posting the
   same requests the provider makes to the same fake: requests/s;
2. pipeline: ``--jobs`` push_send jobs inserted at once into the embedded
   PostgreSQL, run by a real daemon (role worker: job runner, PushSendHandler,
   the APNs provider built from ``[push.apns]``, per-provider limiter,
   results recorded in batches): pushes/s from the insert's commit to the last
   job recorded;
3. stall: the fake stops answering; ``--stall-jobs`` more jobs are inserted and
   the process's resident memory is sampled for ``--stall-seconds`` (in-flight
   sends stay bounded by ``push.max_in_flight``), then the fake answers again.

Prints pushes/s, bare/s, their ratio, the memory figures, and a last JSON line.

Usage: .venv/bin/python bench/push.py [--jobs N] [--bare N] [--registrations R]
       [--concurrency C] [--max-in-flight M] [--stall-seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import bench_database, machine, report  # noqa: E402
from bothy_notify.config import structure_config  # noqa: E402
from bothy_notify.kernel.clock import to_unix_micros  # noqa: E402
from bothy_notify.notify.jobs.args import PUSH_SEND, PushSendArgs  # noqa: E402
from bothy_notify.push.apns import ApnsProvider  # noqa: E402
from bothy_notify.push.port import PushMessage  # noqa: E402
from bothy_notify.wiring import Daemon  # noqa: E402

KEY_ID = "BENCHKEY01"
TEAM_ID = "BENCHTEAM1"
TOPIC = "com.example.bench"


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident memory of this process in MiB."""
    fields: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def process_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by ``pid`` (this process by default)."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        parts = stat.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, to tell how loaded it was."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


class Meter:
    """CPU used per request by this process and by the fake, and how busy the machine was."""

    def __init__(self, fake_pid: int) -> None:
        self._fake_pid = fake_pid
        self._own = process_cpu()
        self._fake = process_cpu(fake_pid)
        self._busy, self._total = machine_busy()

    def stop(self, requests: int) -> dict[str, float]:
        busy, total = machine_busy()
        return {
            "own_cpu_us": (process_cpu() - self._own) / requests * 1e6,
            "fake_cpu_us": (process_cpu(self._fake_pid) - self._fake) / requests * 1e6,
            "machine_busy_pct": 100 * (busy - self._busy) / max(1.0, total - self._total),
        }


class FakeApnsProcess:
    """The fake APNs in its own process, controlled through its stdin."""

    def __init__(self, tmp: Path, key: ec.EllipticCurvePrivateKey) -> None:
        public = tmp / "apns-public.pem"
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.ca_file = str(tmp / "ca.pem")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.push.fake_apns",
                "--public-key",
                str(public),
                "--key-id",
                KEY_ID,
                "--team-id",
                TEAM_ID,
                "--topic",
                TOPIC,
                "--ca-out",
                self.ca_file,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            raise RuntimeError("the fake APNs did not start")
        self.url = f"https://127.0.0.1:{line[1]}"

    def command(self, text: str) -> int:
        """Send ``stall``/``resume``/``count``; returns the requests the fake has seen."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline().split()[1])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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


async def bare_loop(fake_url: str, ca_file: str, pem: str, total: int, concurrency: int) -> float:
    """Requests/s of a plain httpx HTTP/2 client sending the provider's requests."""
    provider_jwt = jwt.encode(
        {"iss": TEAM_ID, "iat": int(time.time())}, pem, algorithm="ES256", headers={"kid": KEY_ID}
    )
    message = PushMessage(
        nid="0190c0de-0000-7000-8000-000000000000",
        kind="message",
        count=1,
        quiet=False,
        thread_id="t1",
        message_id="m1",
    )
    headers = {
        "authorization": f"bearer {provider_jwt}",
        "apns-topic": TOPIC,
        "apns-push-type": "background",
        "apns-priority": "5",
        "apns-collapse-id": "t1",
        "content-type": "application/json",
    }
    body = json.dumps(
        {"aps": {"content-available": 1}, **message.payload()}, separators=(",", ":")
    ).encode()
    remaining = total
    failures = 0
    async with httpx.AsyncClient(
        http2=True,
        verify=ca_file,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        timeout=30,
    ) as client:

        async def worker() -> None:
            nonlocal remaining, failures
            while remaining > 0:
                remaining -= 1
                token = f"{remaining:064x}"
                response = await client.post(
                    f"{fake_url}/3/device/{token}", content=body, headers=headers
                )
                if response.status_code != 200:
                    failures += 1

        await client.post(f"{fake_url}/3/device/{0:064x}", content=body, headers=headers)
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"the bare loop got {failures} non-200 answers")
    return total / elapsed


async def pipeline(
    args: argparse.Namespace, url: str, fake: FakeApnsProcess, pem: str, regs: list[tuple[str, str]]
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

        committed = await trio.to_thread.run_sync(insert_jobs, url, regs, args.jobs, args.warmup)
        meter = Meter(fake.proc.pid)
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
        if occupancy:
            out["runner_in_flight_avg"] = sum(o[0] for o in occupancy) / len(occupancy)
            out["apns_in_flight_avg"] = sum(o[1] for o in occupancy) / len(occupancy)
        elapsed = time.perf_counter() - committed
        out["cpu"] = meter.stop(args.jobs)
        out["pushes_per_s"] = args.jobs / elapsed
        out["pipeline_seconds"] = elapsed
        out["delivered_total"] = daemon.metrics.registry.get_sample_value(
            "bothy_push_sends_total", {"provider": "apns", "outcome": "delivered"}
        )

        # Stall: the fake holds every request; memory must stay bounded.
        fake.command("stall")
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
        fake.command("resume")
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
        fake = FakeApnsProcess(Path(tmp), key)
        try:
            with bench_database() as url:
                regs = await trio.to_thread.run_sync(seed, url, args.registrations)
                meter = Meter(fake.proc.pid)
                bare = await bare_loop(fake.url, fake.ca_file, pem, args.bare, args.concurrency)
                bare_cpu = meter.stop(args.bare)
                print(
                    f"bare httpx HTTP/2 loop: {bare:,.0f} requests/s "
                    f"({args.bare} requests, {args.concurrency} tasks)",
                    flush=True,
                )
                figures = await pipeline(args, url, fake, pem, regs)
        finally:
            fake.close()
    pushes = figures["pushes_per_s"]
    ratio = pushes / bare
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
    for name, cpu in (("bare", bare_cpu), ("pipeline", figures["cpu"])):
        print(
            f"{name}: {cpu['own_cpu_us']:.0f} us CPU per request in this process,"
            f" {cpu['fake_cpu_us']:.0f} us in the fake; machine {cpu['machine_busy_pct']:.0f}%"
            " busy"
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
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = parser.parse_args()
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
