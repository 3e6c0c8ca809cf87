"""Benchmark: the Matrix push gateway, Bothy's against Sygnal, on the same requests.

The same notify requests (the Matrix Push Gateway API: one device each, an APNs
app, ``format: event_id_only``, a new event each) go to each gateway from this
process, ``--concurrency`` at a time over HTTP/1.1 keep-alive connections (what
homeservers use), and each gateway pushes to the same fake APNs (nginx with HTTP/2
and TLS, ``testkit/fakes/nginx.py``, in a process of its own):

- **Bothy**: ``bothy-notify run`` (role ``all``, a fresh database on the embedded
  PostgreSQL or ``$BOTHY_BENCH_DATABASE_URL``'s server) with
  ``[push.apns]`` at the fake and ``[matrix_gateway] apps``; each request makes
  one ``matrix.push_send`` job, run at once by the node's runner, and is
  answered once that push's first attempt is known (``answer_within``);
- **Sygnal**: installed from ``--sygnal-src`` (a source tree of
  ``matrix-sygnal``; Sygnal is not on the package registry here) with its
  dependencies into a cached virtualenv (``.interop/sygnal-<version>``), its
  APNs pushkin pointed at the fake (``bench/_sygnal_run.py``); it answers after
  its send. Without ``--sygnal-src`` the benchmark measures Bothy alone and says so.

Like with like: both answer each request after its push's answer from APNs
(Bothy's ``answer_within``, 2 s, covers the send; a request answered before it
would be counted only once its job is recorded). What is compared is the CPU per
completed push: for Bothy the daemon's process and PostgreSQL's (its database is
part of its cost: registrations, jobs, results), for Sygnal its process, each
from the first request of a batch until the batch's last push is recorded (Bothy:
every job finished in ``bothy.jobs``; Sygnal: every request answered 200 with no
rejected pushkey). Batches of ``--requests`` alternate ``--rounds`` times
(Bothy, Sygnal, Bothy, ...) on warmed gateways (each pushkey was pushed to once
before: Bothy's registrations exist, both have their APNs connections), so a
noisy machine affects both alike. The client's own CPU is not counted.

The floor, measured in the same run and alternated with the gateways: Hypercorn
and Starlette serving a handler that only parses the request's JSON and answers
200 ``{"rejected":[]}`` (``bench/_httpfloor.py``, in a process of its own,
configured as the daemon's API server), fed the same requests by the same
client: its CPU per request is what the libraries Bothy serves HTTP with cost
before any work; each gateway's CPU per push is also given as a ratio to it.

``--baseline-src DIR`` adds a second Bothy run from another source tree (``git
archive main | tar -x -C DIR``: before and after a change), on an embedded
PostgreSQL of its own, alternated with the others in the same run.

Prints per batch and the means, pushes per CPU second of each and their ratio
(the target: Bothy at least 5 times Sygnal), the ratios to the floor, then one
JSON line.

Usage: .venv/bin/python bench/matrix.py [--sygnal-src DIR] [--baseline-src DIR]
       [--requests N] [--concurrency C] [--rounds R] [--pushkeys K] [--profile FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import venv
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    Profiler,
    bench_database,
    machine,
    machine_busy,
    postgres_cpu,
    postgres_pid,
    process_cpu,
    report,
)
from bench._daemon import bench_daemon  # noqa: E402
from bench._httpfloor import bare_http_process  # noqa: E402
from testkit.fakes import KEY_ID, TEAM_ID, TOPIC  # noqa: E402
from testkit.fakes.nginx import NginxFake  # noqa: E402

APP = "im.bench.ios"
NOTIFY = "/_matrix/push/v1/notify"
WORK = ROOT / ".interop"
TARGET = 5.0
"""Bothy's pushes per CPU second at least this many times Sygnal's (issue 32)."""


# ---------------------------------------------------------------- Sygnal


def sygnal_python(source: Path) -> Path:
    """The Python of a virtualenv with Sygnal from ``source`` and its dependencies,
    made once per Sygnal version and kept in ``.interop``."""
    found = re.search(r'^version = "([^"]+)"', (source / "pyproject.toml").read_text(), re.M)
    version = found.group(1) if found else "unknown"
    home = WORK / f"sygnal-{version}"
    python = home / "bin" / "python"
    stamp = home / ".installed"
    if not stamp.exists():
        if home.exists():
            shutil.rmtree(home)
        print(f"installing Sygnal {version} from {source} into {home} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(home)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(source)], check=True)
        stamp.touch()
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Sygnal:
    """Sygnal in a child process, its APNs app pointed at the fake."""

    def __init__(self, python: Path, tmp: Path, key_file: Path, fake: NginxFake) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = {
            "http": {"bind_addresses": ["127.0.0.1"], "port": self.port},
            "log": {
                # Sygnal's access log is at INFO: off, as Bothy logs no request either.
                "setup": {
                    "version": 1,
                    "handlers": {"err": {"class": "logging.StreamHandler"}},
                    "root": {"level": "WARNING", "handlers": ["err"]},
                    "disable_existing_loggers": False,
                },
                "access": {"x_forwarded_for": False},
            },
            "apps": {
                APP: {
                    "type": "apns",
                    "keyfile": str(key_file),
                    "key_id": KEY_ID,
                    "team_id": TEAM_ID,
                    "topic": TOPIC,
                    "platform": "production",
                }
            },
        }
        (tmp / "sygnal.yaml").write_text(yaml.safe_dump(conf))
        env = {
            **os.environ,
            "SYGNAL_CONF": str(tmp / "sygnal.yaml"),
            # Sygnal 0.15.1 refuses to start without it (its move to element-hq).
            "RUN_DESPITE_UNSUPPORTED": "Y",
            "BENCH_APNS_HOST": "127.0.0.1",
            "BENCH_APNS_PORT": fake.url.rsplit(":", 1)[1],
            "BENCH_CA_FILE": fake.ca_file,
        }
        self.log = (tmp / "sygnal.log").open("wb")
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "bench" / "_sygnal_run.py")],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("Sygnal did not start: see sygnal.log") from None
                time.sleep(0.1)

    def cpu(self) -> float:
        return process_cpu(self.proc.pid)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------- the floor


class Floor:
    """Hypercorn + Starlette answering ``POST NOTIFY`` with ``{"rejected":[]}`` after
    parsing its JSON, nothing else (``bench/_httpfloor.py``), in a process of its own."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        pipe, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=bare_http_process,
            args=(child, "starlette", NOTIFY, {"rejected": []}),
            daemon=True,
        )
        self.proc.start()
        if not pipe.poll(60):
            raise RuntimeError("the floor's server did not start")
        self.url = f"http://{pipe.recv()}"

    def cpu(self) -> float:
        assert self.proc.pid is not None
        return process_cpu(self.proc.pid)

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


# ---------------------------------------------------------------- Bothy


class Bothy:
    """``bothy-notify run`` (role all, on ``database``) serving the gateway; ``source``:
    another source tree to run instead of this one (put first on ``PYTHONPATH``)."""

    def __init__(
        self,
        tmp: Path,
        database: str,
        key_pem: str,
        fake: NginxFake,
        source: Path | None = None,
    ) -> None:
        settings = {
            "server": {"api_listen": "127.0.0.1:0", "gateway_listen": "127.0.0.1:0"},
            "database": {"url": database},
            "push": {
                "apns": {
                    "key": "env:BENCH_APNS_KEY",
                    "key_id": KEY_ID,
                    "team_id": TEAM_ID,
                    "bundle_id": TOPIC,
                    "endpoint": fake.url,
                    "ca_file": fake.ca_file,
                }
            },
            "matrix_gateway": {
                "apps": {APP: "apns"},
                # The benchmark is one source address sending as fast as it can.
                "requests_per_second": 1_000_000,
                "requests_burst": 1_000_000,
            },
            "log": {"level": "warning"},
        }
        env = {"BENCH_APNS_KEY": key_pem}
        if source is not None:
            env["PYTHONPATH"] = str(source)
        self.daemon = bench_daemon(tmp, settings, env, name="bothy")
        self.daemon.start_sync()
        self.url = self.daemon.api_url
        self.database = database
        self.postmaster = postgres_pid(database)

    def cpu(self) -> float:
        return self.own_cpu() + self.postgres_cpu()

    def own_cpu(self) -> float:
        return self.daemon.tree_cpu_seconds()

    def postgres_cpu(self) -> float:
        return postgres_cpu(self.postmaster) if self.postmaster else 0.0

    def unfinished(self) -> int:
        with psycopg.connect(self.database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM bothy.jobs WHERE kind = 'matrix.push_send'"
                " AND state IN ('available', 'running')"
            ).fetchone()
        return int(row[0]) if row else 0

    def jobs_per_transaction(self) -> float:
        """Gateway jobs per transaction that made them (a grouped transaction's jobs
        share its time)."""
        with psycopg.connect(self.database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*)::float / greatest(1, count(DISTINCT created_at))"
                " FROM bothy.jobs WHERE kind = 'matrix.push_send'"
            ).fetchone()
        return round(float(row[0]), 2) if row else 0.0

    def outcomes(self) -> dict[str, int]:
        """``bothy_matrix_notifications_total`` by outcome (every batch so far)."""
        out: dict[str, int] = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=30).text.splitlines():
            if line.startswith("bothy_matrix_notifications_total{"):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out[outcome] = out.get(outcome, 0) + int(float(line.rsplit(" ", 1)[1]))
        return out

    def close(self) -> None:
        self.daemon.stop_sync()


# ---------------------------------------------------------------- the load


def notification(pushkey: str) -> dict[str, Any]:
    """A notify request as Synapse sends one for an ``event_id_only`` pusher."""
    return {
        "notification": {
            "event_id": f"${uuid.uuid4().hex}",
            "room_id": "!bench:bothy.test",
            "prio": "high",
            "counts": {"unread": 1},
            "devices": [
                {
                    "app_id": APP,
                    "pushkey": pushkey,
                    "pushkey_ts": 1_700_000_000,
                    "data": {"format": "event_id_only"},
                }
            ],
        }
    }


async def send_batch(
    url: str, pushkeys: list[str], count: int, concurrency: int
) -> tuple[int, int]:
    """Post ``count`` notify requests, ``concurrency`` at a time; returns how many were
    answered 200 with nothing rejected, and how many got no answer (the connection
    closed: counted, not retried)."""
    ok = 0
    lost = 0
    left = count
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:

        async def worker() -> None:
            nonlocal ok, left, lost
            while left > 0:
                left -= 1
                try:
                    answer = await client.post(
                        NOTIFY, json=notification(pushkeys[left % len(pushkeys)])
                    )
                except httpx.TransportError:
                    lost += 1
                    continue
                if answer.status_code == 200 and answer.json() == {"rejected": []}:
                    ok += 1

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    return ok, lost


def measure(
    gateway: Bothy | Sygnal | Floor, args: argparse.Namespace, pushkeys: list[str]
) -> dict[str, Any]:
    """One batch: wall time, the gateway's CPU per completed push."""
    busy0 = machine_busy()
    pg0 = gateway.postgres_cpu() if isinstance(gateway, Bothy) else 0.0
    cpu0, wall0 = gateway.cpu(), time.perf_counter()
    profiler = (
        Profiler(args.profile, pid=gateway.daemon.pid, gil=True)
        if args.profile and isinstance(gateway, Bothy)
        else None
    )
    ok, lost = trio.run(send_batch, gateway.url, pushkeys, args.requests, args.concurrency)
    if isinstance(gateway, Bothy):
        deadline = time.monotonic() + 120
        while gateway.unfinished() and time.monotonic() < deadline:
            time.sleep(0.02)
    wall, cpu = time.perf_counter() - wall0, gateway.cpu() - cpu0
    pg = (gateway.postgres_cpu() - pg0) if isinstance(gateway, Bothy) else 0.0
    if profiler is not None:
        profiler.stop()
    busy1 = machine_busy()
    load = (busy1[0] - busy0[0]) / max(1.0, busy1[1] - busy0[1])
    return {
        "pushes": ok,
        "unanswered": lost,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "pushes_per_s": round(ok / wall, 1),
        "pushes_per_cpu_s": round(ok / cpu, 1) if cpu > 0 else None,
        "cpu_us_per_push": round(cpu / ok * 1e6, 1) if ok else None,
        "postgres_us_per_push": round(pg / ok * 1e6, 1) if ok else None,
        "machine_busy": round(load, 2),
    }


def mean(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return sum(values) / len(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sygnal-src", type=Path, default=None)
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="also run Bothy from this source tree (e.g. main's), alternated",
    )
    parser.add_argument("--requests", type=int, default=2000, help="notify requests per batch")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="batches of each gateway")
    parser.add_argument("--pushkeys", type=int, default=500, help="distinct devices")
    parser.add_argument(
        "--profile", default="", help="py-spy the daemon during each Bothy batch into FILE"
    )
    args = parser.parse_args()
    sygnal_py = sygnal_python(args.sygnal_src.resolve()) if args.sygnal_src else None
    pushkeys = [f"{i:064x}" for i in range(1, args.pushkeys + 1)]
    with (
        tempfile.TemporaryDirectory(prefix="bothy-bench-matrix-") as workdir,
        bench_database() as url,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(workdir)
        base_url = stack.enter_context(bench_database()) if args.baseline_src else None
        fake = NginxFake(tmp)
        key = ec.generate_private_key(ec.SECP256R1())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        key_file = tmp / "apns-key.p8"
        key_file.write_text(key_pem)
        (tmp / "bothy").mkdir()
        (tmp / "sygnal").mkdir()
        (tmp / "baseline").mkdir()
        floor = Floor()
        bothy = Bothy(tmp / "bothy", url, key_pem, fake)
        baseline = (
            Bothy(tmp / "baseline", base_url, key_pem, fake, args.baseline_src.resolve())
            if base_url is not None and args.baseline_src is not None
            else None
        )
        sygnal = Sygnal(sygnal_py, tmp / "sygnal", key_file, fake) if sygnal_py else None
        gateways: list[tuple[str, Bothy | Sygnal | Floor]] = [("floor", floor), ("bothy", bothy)]
        if baseline is not None:
            gateways.append(("baseline", baseline))
        if sygnal is not None:
            gateways.append(("sygnal", sygnal))
        try:
            for _name, gateway in gateways:  # warm-up: every pushkey once
                trio.run(send_batch, gateway.url, pushkeys, len(pushkeys), args.concurrency)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in gateways}
            for round_no in range(args.rounds):
                for name, gateway in gateways:
                    figures = measure(gateway, args, pushkeys)
                    runs[name].append(figures)
                    print(f"round {round_no + 1} {name}: {figures}", flush=True)
            outcomes = bothy.outcomes()
            grouped = bothy.jobs_per_transaction()
            print(f"Bothy's answers by outcome (warm-up included): {outcomes}")
            print(f"Bothy's gateway jobs per transaction: {grouped}")
            if baseline is not None:
                print(f"the baseline's answers by outcome: {baseline.outcomes()}")
        finally:
            if sygnal is not None:
                sygnal.close()
            if baseline is not None:
                baseline.close()
            bothy.close()
            floor.close()
            fake.close()
    summary: dict[str, Any] = {}
    for name, done in runs.items():
        summary[name] = {
            "pushes_per_cpu_s": round(mean(done, "pushes_per_cpu_s"), 1),
            "cpu_us_per_push": round(mean(done, "cpu_us_per_push"), 1),
            "pushes_per_s": round(mean(done, "pushes_per_s"), 1),
            "postgres_us_per_push": round(mean(done, "postgres_us_per_push"), 1),
        }
        print(f"{name}: {summary[name]}")
    floor_us = summary["floor"]["cpu_us_per_push"]
    to_floor: dict[str, float | None] = {}
    for name, figures in summary.items():
        if name == "floor":
            continue
        own = figures["cpu_us_per_push"] - figures["postgres_us_per_push"]
        to_floor[name] = round(figures["cpu_us_per_push"] / floor_us, 2) if floor_us else None
        if figures["postgres_us_per_push"]:
            to_floor[f"{name}_without_postgres"] = round(own / floor_us, 2) if floor_us else None
    print(
        f"the floor (Hypercorn + Starlette, JSON parsed, 200): {floor_us} us of CPU per request;"
        f" CPU per push / the floor's per request: {to_floor}"
    )
    ratio = None
    if "sygnal" in summary and summary["sygnal"]["pushes_per_cpu_s"]:
        ratio = round(
            summary["bothy"]["pushes_per_cpu_s"] / summary["sygnal"]["pushes_per_cpu_s"], 2
        )
        print(f"Bothy / Sygnal, pushes per CPU second: {ratio} (target >= {TARGET})")
    else:
        print("Sygnal not measured (no --sygnal-src): Bothy alone")
    before = None
    if "baseline" in summary and summary["bothy"]["cpu_us_per_push"]:
        before = round(
            summary["baseline"]["cpu_us_per_push"] / summary["bothy"]["cpu_us_per_push"], 2
        )
        print(f"the baseline's CPU per push / this tree's: {before}")
    report(
        "matrix",
        requests=args.requests,
        concurrency=args.concurrency,
        rounds=args.rounds,
        sygnal_measured=args.sygnal_src is not None,
        ratio=ratio,
        target=TARGET,
        floor_cpu_us_per_request=floor_us,
        cpu_per_push_to_floor=to_floor,
        baseline_measured=args.baseline_src is not None,
        baseline_to_this_cpu_per_push=before,
        machine=machine(),
        bothy_outcomes=outcomes,
        bothy_jobs_per_transaction=grouped,
        figures=summary,
        runs=runs,
    )


if __name__ == "__main__":
    main()
