"""Benchmark: memory over a long run of a cluster, and a check of its whole history.

Two (or ``--variants``: one per variant) ``bothy-notify run --config FILE``
processes (``cluster.mode = "multi"``, role ``all``) on one embedded
PostgreSQL, each recording its fake pushes (``push.fake.record_file``). In
their own processes:

- **the producer** posts ``message.created`` at ``--rate`` events/s (20) with
  ``POST /v1/events``, one event per request, alternating between the nodes,
  into threads the people follow (level ``all``); each request carries an
  ``Idempotency-Key``, so a request that fails (its node is restarting) goes to
  the next node without ever appending twice;
- **the desktops** (one process per node): ``--desktops`` people's desktops
  (spread over the nodes) identify, ping at the hello's ``heartbeat_ms`` and
  read their hints; every minute ``--churn`` of them disconnect and reconnect;
- **the phones**: every person has a phone registered on the ``fake``
  provider, so each hint is a push.

Every ``--restart-every`` minutes one of the ``--restart`` nodes (by default
every node but the first) is stopped with SIGTERM (a graceful stop, drained
within ``server.drain_period``) and started again on the same ports; with
``--kill-every`` some of those stops are SIGKILL instead.

**Memory.** RSS per node every minute, the growth from the end of the
``--warmup`` minutes to the end in % (target: <= 5 %) and its slope (MB/min,
least squares over the minutes after the warm-up), for the nodes never
restarted; with tracing, each node's top ``tracemalloc`` growers between the
two snapshots (SIGUSR2 at the warm-up's end and at the end). Tracing costs memory
of its own (a larger RSS). A variant is ``+``-joined words: ``trace`` or
``notrace`` (``BOTHY_NOTIFY_MEMORY_TRACE``; ``--no-trace`` is the default for nodes
that say neither), ``notrim`` (``BOTHY_NOTIFY_MALLOC_TRIM=off``) and ``arena2``
(``MALLOC_ARENA_MAX=2``), so one run compares them side by side under the same load.

**History** (``bench/_history.py``). Once the producer stops and the cluster has
settled, from the producer's accepted messages, the ``notify.push_send`` jobs
and every node's fake-provider record: every (message, follower) decided
exactly once and sent exactly once to the follower's phone or skipped (as the
nodes counted skips), no duplicate after a graceful stop, and each duplicate
after a SIGKILL explained by its job being claimed again.

The default is a short run (5 minutes, one restart); ``make bench`` runs that.
The figures: ``--minutes 30 --warmup 5 --restart-every 4``.

Usage: .venv/bin/python bench/soak.py [--minutes 5] [--warmup 1] [--rate 20]
       [--people 100] [--threads 50] [--desktops 60] [--churn 0.2] [--no-trace]
       [--variants trace,trace+notrim] [--restart-every 3] [--restart b]
       [--kill-every 0]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, report
from bench._daemon import KEY, BenchDaemon
from bench._history import PushJob, Send, Stop, check, followers_of
from bothy_notify.auth import mint_token
from testkit.daemon import cluster_node_settings, write_settings
from testkit.ws import PING, Closed, GatewayClient

TARGET_PCT = 5.0
TOP = 8
"""Growers per node in the report."""
START_TIMEOUT = 180.0
"""Seconds a node may take to serve (a loaded machine imports the daemon slowly)."""
SETTLE_TIMEOUT = 300.0
"""Seconds the cluster may take, once the producer stops, to finish every job due."""
VARIANT_WORDS = frozenset({"trace", "notrace", "notrim", "arena2"})
SEND_SKIPS = frozenset({"read", "active_in_thread", "no_registration", "expired", "no_access"})
"""The ``bothy_push_skipped_total`` reasons a push job can end with (a gateway hint's
``no_connection`` and a node's ``node_gone`` are not about pushes)."""


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (``VmRSS`` of ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, MB) points, MB per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def now_utc() -> datetime:
    return datetime.now(UTC)


# -- the nodes -------------------------------------------------------------------------


class Node(BenchDaemon):
    """One soak node (the kit's launcher); ``variant`` says how its memory is handled
    (module docstring)."""

    def __init__(self, name: str, workdir: Path, url: str, variant: str, trace: bool) -> None:
        words = set(variant.split("+")) - {""}
        unknown = words - VARIANT_WORDS
        if unknown:
            raise SystemExit(f"unknown variant word(s) {sorted(unknown)} in {variant!r}")
        records = workdir / f"{name}-pushes.jsonl"
        config = cluster_node_settings(records, database={"pool_size": 10})
        trace_file = workdir / f"{name}-memtrace.json"
        env = {"BOTHY_BENCH_DATABASE": url, "BOTHY_BENCH_KEY": KEY}
        if "trace" in words or (trace and "notrace" not in words):
            env["BOTHY_NOTIFY_MEMORY_TRACE"] = str(trace_file)
        if "notrim" in words:
            env["BOTHY_NOTIFY_MALLOC_TRIM"] = "off"
        if "arena2" in words:
            env["MALLOC_ARENA_MAX"] = "2"
        super().__init__(
            config_file=write_settings(workdir / f"{name}.toml", config),
            log_file=workdir / f"{name}.log",
            env=env,
            cwd=workdir,
        )
        self.variant = variant or "default"
        self.records = records
        self.trace = trace_file
        self.lives = 1
        self.skips_before: dict[str, float] = {}
        """Skips counted in the node's earlier lives, by reason (their counters ended
        with them)."""

    @property
    def traced(self) -> bool:
        return "BOTHY_NOTIFY_MEMORY_TRACE" in self.env

    def skipped(self) -> dict[str, float]:
        """Skips this life counted, by reason (``bothy_push_skipped_total``)."""
        out: dict[str, float] = {}
        for key, value in self.metrics().items():
            if key.startswith("bothy_push_skipped_total{"):
                reason = key.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = out.get(reason, 0.0) + value
        return out

    def bank_skips(self) -> None:
        """Keep this life's skip counts before it ends."""
        for reason, value in self.skipped().items():
            self.skips_before[reason] = self.skips_before.get(reason, 0.0) + value

    def restart(self, sig: signal.Signals) -> dict[str, Any]:
        """Stop with ``sig``, start again on the same ports; returns what happened,
        for the report."""
        assert self.process is not None
        self.bank_skips()
        at = now_utc()
        began = time.monotonic()
        self.kill(sig)
        code = self.process.wait(60)
        stopped = time.monotonic() - began
        self.start_sync(timeout=START_TIMEOUT)
        self.lives += 1
        return {
            "node": self.name,
            "signal": sig.name,
            "at": at.isoformat(),
            "exit": code,
            "stop_s": round(stopped, 2),
            "start_s": round(time.monotonic() - began - stopped, 1),
        }

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def memory_report(self, timeout: float = 300.0) -> dict[str, Any] | None:
        """SIGUSR2, then the report the node writes (``None`` without tracing)."""
        if not self.traced:
            return None
        before = self.trace.stat().st_mtime_ns if self.trace.exists() else 0
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.trace.exists() and self.trace.stat().st_mtime_ns != before:
                found: dict[str, Any] = json.loads(self.trace.read_text())
                return found
            time.sleep(0.2)
        raise RuntimeError(f"node {self.name} wrote no memory report")


# -- set-up --------------------------------------------------------------------------------


def backend_token() -> str:
    return mint_token(KEY, {"sub": "backend", "scope": "events:write"})


def user_token(user: str, device: str, platform: str) -> str:
    return mint_token(KEY, {"sub": user, "did": device, "plat": platform, "kind": "user"})


def seed(api: str, people: int, threads: int) -> None:
    """People, threads, memberships and follows (person i follows thread i % threads),
    and every person's phone registered on the fake provider."""
    events: list[dict[str, Any]] = [
        {"type": "user.upserted", "payload": {"user_id": "author", "kind": "human", "active": True}}
    ]
    events += [
        {"type": "thread.upserted", "payload": {"thread_id": f"t{t}", "space_id": "soak"}}
        for t in range(threads)
    ]
    for i in range(people):
        user = f"u{i}"
        events += [
            {
                "type": "user.upserted",
                "payload": {"user_id": user, "kind": "human", "active": True},
            },
            {"type": "member.added", "payload": {"user_id": user, "scope_id": "soak"}},
            {
                "type": "thread.followed",
                "payload": {"user_id": user, "thread_id": f"t{i % threads}", "level": "all"},
            },
        ]
    with httpx.Client(base_url=f"http://{api}", timeout=60) as client:
        auth = {"authorization": f"Bearer {backend_token()}"}
        for start in range(0, len(events), 500):
            client.post(
                "/v1/events", json={"events": events[start : start + 500]}, headers=auth
            ).raise_for_status()
        for i in range(people):
            token = user_token(f"u{i}", f"u{i}-phone", "ios")
            client.post(
                "/v1/registrations",
                json={"provider": "fake", "token": f"phone-{i}"},
                headers={"authorization": f"Bearer {token}"},
            ).raise_for_status()


# -- the producer --------------------------------------------------------------------------


def producer_process(
    pipe: Connection,
    apis: list[str],
    threads: int,
    rate: float,
    sent: Synchronized[int],
    accepted_file: str,
) -> None:
    """Post messages at ``rate``; each is tried on every node in turn (same
    ``Idempotency-Key``) until one takes it. Every accepted message id and its
    thread go to ``accepted_file``, one JSON line each."""
    clients = [httpx.Client(base_url=f"http://{api}", timeout=30) for api in apis]
    auth = {"authorization": f"Bearer {backend_token()}"}
    errors = 0
    retried = 0
    refused = 0
    k = 0
    start = time.monotonic()
    with open(accepted_file, "a", encoding="utf-8") as accepted:
        while not pipe.poll():
            thread = f"t{k % threads}"
            payload = {
                "thread_id": thread,
                "message_id": f"m{k}",
                "thread_seq": k // threads + 1,
                "author_id": "author",
                "mentions": [],
            }
            headers = {**auth, "idempotency-key": f"soak-m{k}"}
            taken = False
            for attempt in range(3 * len(clients)):
                client = clients[(k + attempt) % len(clients)]
                try:
                    response = client.post(
                        "/v1/events",
                        json={"events": [{"type": "message.created", "payload": payload}]},
                        headers=headers,
                    )
                except httpx.HTTPError:
                    errors += 1
                else:
                    if response.status_code == 200:
                        taken = True
                        break
                    errors += 1
                retried += 1
                time.sleep(0.2 if attempt >= len(clients) - 1 else 0)
            if taken:
                accepted.write(json.dumps([f"m{k}", thread]) + "\n")
            else:
                refused += 1
            k += 1
            sent.value = k
            pause = start + k / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
    pipe.send({"sent": k, "errors": errors, "retried": retried, "refused": refused})


# -- the desktops --------------------------------------------------------------------------


def desktop_process(
    pipe: Connection,
    gateway: str,
    users: list[str],
    churn: float,
    connects: Synchronized[int],
    hints: Synchronized[int],
) -> None:
    trio.run(_desktops, pipe, gateway, users, churn, connects, hints)


async def _desktops(
    pipe: Connection,
    gateway: str,
    users: list[str],
    churn: float,
    connects: Synchronized[int],
    hints: Synchronized[int],
) -> None:
    scopes: dict[str, trio.CancelScope] = {}
    closes: dict[str, int] = {}
    pings = 0

    async def heartbeat(ws: GatewayClient, every: float) -> None:
        nonlocal pings
        while True:
            await trio.sleep(every)
            await ws.send_frame(PING)
            pings += 1

    async def read(ws: GatewayClient) -> None:
        while True:
            if (await ws.op()).get("type") == "notification.created":
                hints.value += 1

    async def desktop(user: str) -> None:
        token = user_token(user, f"{user}-desktop", "linux")
        while True:
            with trio.CancelScope() as scope:
                scopes[user] = scope
                try:
                    ws = await GatewayClient.open(gateway)
                except (OSError, Closed, trio.BrokenResourceError):
                    # Refused, or reset by a stopping node's listener before the upgrade.
                    closes["refused"] = closes.get("refused", 0) + 1
                    await trio.sleep(1.0)
                    continue
                try:
                    heartbeat_ms = await ws.identify(token)
                    connects.value += 1
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(heartbeat, ws, heartbeat_ms / 1000)
                        await read(ws)
                except* Closed as group:
                    # A stopping node closes with 1001 (the reader's or the pinger's).
                    code = first_closed(group).code
                    key = str(code) if code is not None else "1006"
                    closes[key] = closes.get(key, 0) + 1
                    await trio.sleep(1.0)
                finally:
                    await ws.aclose()
            if scope.cancelled_caught:
                closes["churned"] = closes.get("churned", 0) + 1
                await trio.sleep(random.uniform(0.5, 5.0))  # then back, as a laptop wakes

    async def churner() -> None:
        rng = random.Random(len(users))
        while True:
            await trio.sleep(60.0)
            for user in rng.sample(users, max(1, round(churn * len(users)))):
                scopes[user].cancel()

    async with trio.open_nursery() as nursery:
        for user in users:
            nursery.start_soon(desktop, user)
            await trio.sleep(0.02)  # a gentle start
        if churn > 0 and users:
            nursery.start_soon(churner)
        await trio.to_thread.run_sync(pipe.recv)
        nursery.cancel_scope.cancel()
    pipe.send({"closes": closes, "pings": pings})


def answer(pipe: Connection, proc: Any, what: str, *, stop: bool = False) -> Any:
    """The closing report of a helper process (told to stop first when ``stop``), or
    ``None`` when it died: the soak says so and goes on to its history."""
    try:
        if stop:
            pipe.send("stop")
        if pipe.poll(120):
            found = pipe.recv()
            proc.join(30)
            return found
    except (EOFError, OSError):
        pass
    print(f"          {what} ended early (exit code {proc.exitcode})", flush=True)
    return None


def first_closed(group: BaseExceptionGroup[Closed]) -> Closed:
    """The first :class:`Closed` of ``group`` (nested groups unwrapped)."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    assert isinstance(found, Closed)
    return found


# -- the history ---------------------------------------------------------------------------


def settle(url: str, timeout: float = SETTLE_TIMEOUT) -> float:
    """Wait until no job is running or due; returns the seconds it took."""
    began = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() - began < timeout:
            row = conn.execute(
                "SELECT count(*) FROM bothy.jobs WHERE state = 'running'"
                " OR (state = 'available' AND scheduled_at <= now())"
            ).fetchone()
            if row is not None and row[0] == 0:
                return time.monotonic() - began
            time.sleep(0.5)
    raise RuntimeError("the cluster did not settle")


def push_jobs(url: str) -> list[PushJob]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, args->>'message_id', args->>'user_id', args->>'registration_id',"
            " args->>'nid', state, attempt, claim FROM bothy.jobs"
            " WHERE kind = 'notify.push_send'"
        ).fetchall()
    return [PushJob(*row) for row in rows]


def fake_sends(nodes: list[Node]) -> list[Send]:
    out: list[Send] = []
    for node in nodes:
        if not node.records.exists():
            continue
        for line in node.records.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a SIGKILL
            payload = record["payload"]
            out.append(
                Send(
                    node.name,
                    datetime.fromisoformat(record["at"]),
                    record["registration_id"],
                    payload.get("nid", ""),
                    payload.get("kind", ""),
                )
            )
    return out


def read_accepted(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            message_id, thread_id = json.loads(line)
            out[message_id] = thread_id
    return out


# -- the benchmark -------------------------------------------------------------------------


def growers(start: dict[str, Any] | None, end: dict[str, Any] | None) -> dict[str, Any] | None:
    if end is None:
        return None
    here = str(Path(__file__).resolve().parent.parent) + "/"
    out = []
    for g in end.get("growers", [])[:TOP]:
        site = g["site"].replace(here, "")
        if "site-packages/" in site:
            site = site.split("site-packages/", 1)[1]
        out.append({"site": site, "kb": round(g["size_diff"] / 1024, 1), "blocks": g["count_diff"]})
    traced = None
    if start is not None:
        traced = round((end["traced_bytes"] - start["traced_bytes"]) / 1048576, 2)
    return {"traced_growth_mb": traced, "top": out}


def stops_due(args: argparse.Namespace, minute: int) -> signal.Signals | None:
    """The stop (if any) the soak makes after ``minute``."""
    if args.restart_every <= 0 or minute % args.restart_every or minute >= args.minutes:
        return None
    if args.kill_every > 0 and minute % args.kill_every == 0:
        return signal.SIGKILL
    return signal.SIGTERM


def run(args: argparse.Namespace, workdir: Path, url: str) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    variants = args.variants or ["", ""]
    names = [chr(ord("a") + i) for i in range(len(variants))]
    nodes = [
        Node(name, workdir, url, variant, not args.no_trace)
        for name, variant in zip(names, variants, strict=True)
    ]
    restartable = [n for n in nodes if n.name in (args.restart or names[1:])]
    accepted_file = workdir / "accepted.jsonl"
    out: dict[str, Any] = {}
    stops: list[dict[str, Any]] = []
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_serving_sync(timeout=START_TIMEOUT)
            node.pin_ports()
        print(
            f"{len(nodes)} nodes serving: "
            + ", ".join(f"{n.name} ({n.variant}, pid {n.pid})" for n in nodes),
            flush=True,
        )
        seed(nodes[0].api, args.people, args.threads)
        time.sleep(3.0)  # the round applies the seed

        sent = ctx.Value("q", 0)
        connects = ctx.Value("q", 0)
        hints = ctx.Value("q", 0)
        desktops: list[tuple[Connection, Any]] = []
        for k, node in enumerate(nodes):
            assert node.gateway is not None
            users = [f"u{i}" for i in range(args.desktops) if i % len(nodes) == k]
            pipe, child = ctx.Pipe()
            proc = ctx.Process(
                target=desktop_process,
                args=(child, node.gateway, users, args.churn, connects, hints),
                daemon=True,  # ended with the soak, whatever ends it
            )
            proc.start()
            desktops.append((pipe, proc))
        ppipe, pchild = ctx.Pipe()
        producer = ctx.Process(
            target=producer_process,
            args=(pchild, [n.api for n in nodes], args.threads, args.rate, sent, accepted_file),
            daemon=True,
        )
        producer.start()
        started = time.monotonic()
        print(
            f"load: {args.rate:g} events/s, {args.desktops} desktops (churn"
            f" {args.churn:.0%}/min), {args.people} phones; {args.minutes} min,"
            f" warm-up {args.warmup} min; restarts every {args.restart_every or '-'} min"
            f" of {', '.join(n.name for n in restartable) or '-'}"
            + (f", SIGKILL every {args.kill_every} min" if args.kill_every else ""),
            flush=True,
        )
        series: dict[str, list[tuple[float, float]]] = {n.name: [] for n in nodes}
        at_warmup: dict[str, float] = {}
        traces_start: dict[str, dict[str, Any] | None] = {}
        turn = 0
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            for node in nodes:
                if node.process is not None and node.process.poll() is not None:
                    raise RuntimeError(f"node {node.name} exited:\n{node.log_tail()}")
                series[node.name].append((minute, node.rss_mb()))
            rss = ", ".join(f"{n}: {s[-1][1]:.1f} MB" for n, s in series.items())
            print(
                f"[{minute:3d} min] RSS {rss}; events {sent.value}, desktop connects"
                f" {connects.value}, hints {hints.value}",
                flush=True,
            )
            if minute == args.warmup:
                traces_start = {n.name: n.memory_report() for n in nodes}
                # After the first snapshot: taking it leaves its own few MB in the RSS
                # (freed to the allocator, not to the system), which is no growth.
                at_warmup = {n.name: n.rss_mb() for n in nodes}
                print("          warm-up over: the baseline (RSS, tracemalloc)", flush=True)
            sig = stops_due(args, minute)
            if sig is not None and restartable:
                node = restartable[turn % len(restartable)]
                turn += 1
                stop = node.restart(sig)
                stops.append(stop)
                print(
                    f"          {stop['signal']} to {node.name}: exit {stop['exit']} after"
                    f" {stop['stop_s']} s, serving again {stop['start_s']} s later",
                    flush=True,
                )
        at_end = {n: s[-1][1] for n, s in series.items()}
        traces_end = {n.name: n.memory_report() for n in nodes}
        produced = answer(ppipe, producer, "the producer", stop=True) or {
            "sent": sent.value,
            "errors": None,
            "retried": None,
            "refused": None,
        }
        ends = [
            end
            for pipe, proc in desktops
            if (end := answer(pipe, proc, "a desktops process", stop=True)) is not None
        ]
        settled_s = settle(url)
        metrics = {n.name: n.metrics() for n in nodes}
        skips: dict[str, float] = {}
        for node in nodes:
            node.bank_skips()
            for reason, value in node.skips_before.items():
                skips[reason] = skips.get(reason, 0.0) + value
        holder = [n.name for n in nodes if metrics[n.name].get("bothy_consumer_holder") == 1]
    finally:
        for node in nodes:
            node.stop_sync()

    history = check(
        accepted=read_accepted(accepted_file),
        followers=followers_of(args.people, args.threads),
        jobs=push_jobs(url),
        sends=fake_sends(nodes),
        stops=[Stop(s["node"], s["signal"], datetime.fromisoformat(s["at"])) for s in stops],
        skips_counted=round(sum(v for k, v in skips.items() if k in SEND_SKIPS)),
    )
    closes: dict[str, int] = {}
    for end in ends:
        for key, count in end["closes"].items():
            closes[key] = closes.get(key, 0) + count
    steady = [n.name for n in nodes if n.lives == 1]
    out.update(
        minutes=args.minutes,
        warmup_minutes=args.warmup,
        rate=args.rate,
        events_sent=produced["sent"],
        event_errors=produced["errors"],
        event_retries=produced["retried"],
        events_refused=produced["refused"],
        desktop_connects=connects.value,
        desktop_closes=closes,
        pings=sum(e["pings"] for e in ends),
        hints=hints.value,
        variants={n.name: n.variant + ("" if n.traced else " (untraced)") for n in nodes},
        round_holder_at_end=holder,
        stops=stops,
        settled_s=round(settled_s, 1),
        skips_by_reason={k: round(v) for k, v in sorted(skips.items()) if v},
        history=history.as_dict(),
        rss_mb_warmup={n: round(v, 1) for n, v in at_warmup.items() if n in steady},
        rss_mb_end={n: round(v, 1) for n, v in at_end.items() if n in steady},
        growth_pct={n: round(100 * (at_end[n] - at_warmup[n]) / at_warmup[n], 2) for n in steady},
        slope_mb_per_min={
            n: None if (v := slope(series[n][args.warmup :])) is None else round(v, 3)
            for n in steady
        },
        rss_mb_per_minute={n: [round(y, 1) for _, y in s] for n, s in series.items()},
        tracemalloc={n: growers(traces_start.get(n), traces_end[n]) for n in traces_end},
    )
    out["within_target"] = all(g <= TARGET_PCT for g in out["growth_pct"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=5, help="how long the load runs")
    parser.add_argument("--warmup", type=int, default=1, help="minutes before the baseline")
    parser.add_argument("--rate", type=float, default=20.0, help="message events/s")
    parser.add_argument("--people", type=int, default=100, help="people, each with a phone")
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--desktops", type=int, default=60, help="people with a desktop too")
    parser.add_argument("--churn", type=float, default=0.2, help="desktops reconnecting a minute")
    parser.add_argument("--no-trace", action="store_true", help="no tracemalloc in the nodes")
    parser.add_argument(
        "--variants",
        type=lambda v: v.split(","),
        default=None,
        help="one node per variant, comma-separated (e.g. trace,trace+notrim,notrace+arena2)",
    )
    parser.add_argument(
        "--restart-every", type=int, default=3, help="minutes between two stops; 0: none"
    )
    parser.add_argument(
        "--restart", nargs="*", default=None, help="nodes to stop (default: all but a)"
    )
    parser.add_argument(
        "--kill-every", type=int, default=0, help="a stop at a multiple of this is a SIGKILL"
    )
    args = parser.parse_args()
    if not 1 <= args.warmup < args.minutes:
        parser.error("--warmup must be at least 1 and below --minutes")
    if args.desktops > args.people:
        parser.error("--desktops must be at most --people")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bothy-soak-") as tmp, bench_database() as url:
        out = run(args, Path(tmp), url)
    history = out["history"]
    print(
        f"history: {history['messages']} messages, {history['expected_pushes']} pushes due,"
        f" {history['push_jobs']} push jobs, {history['sent_once']} sent,"
        f" {history['skipped']} skipped ({history['skips_counted']} counted);"
        f" lost {history['lost']}, decided twice {history['decided_twice']},"
        f" unfinished {history['unfinished']}, duplicates: after a graceful stop"
        f" {history['duplicates_graceful']}, after a kill {history['duplicates_after_kill']},"
        f" unexplained {history['duplicates_unexplained']}; sent undecided"
        f" {history['sent_undecided']} -> {'OK' if history['ok'] else 'FAILED'}"
    )
    for stop in out["stops"]:
        print(f"stop: {stop}")
    print(f"growth after the warm-up: {out['growth_pct']} % (target <= {TARGET_PCT:g} %)")
    print(f"slope: {out['slope_mb_per_min']} MB/min; variants {out['variants']}")
    for name, found in out["tracemalloc"].items():
        if found is None:
            continue
        print(f"node {name}: tracemalloc growth {found['traced_growth_mb']} MB; top growers:")
        for g in found["top"]:
            print(f"    {g['kb']:>9.1f} KB  {g['blocks']:>7d} blocks  {g['site']}")
    print(f"machine: {machine()}; took {time.monotonic() - started:.0f} s", flush=True)
    report("soak", **out)


if __name__ == "__main__":
    main()
