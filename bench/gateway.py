"""Benchmark: the WebSocket gateway, with its clients in a separate process.

(a) Memory: a client process opens N authenticated idle connections (each one
    hello -> identify -> catchup.complete); the server's resident memory
    before and after gives KB per connection (targets: >= 10,000 connections
    in one process at <= 25 KB each).
(b) Latency: D desktops (macos, one followed thread each) are live; producer
    processes append ``message.created`` events with ``bothy.append_event`` at
    R events/s spread over the D threads; the client process records when each
    ``notification.created`` arrives. Latency = arrival - the moment
    ``append_event`` returned, both on ``time.monotonic()`` (CLOCK_MONOTONIC is
    one clock for every process of the machine). Targets (issue 11): p50 <= 5
    ms, p99 <= 25 ms at 200 events/s over 1,000 desktops with 10,000 idle
    connections.
(c) The same at ten times the rate (``--high-rate``, 2,000 hints/s by
    default, for ``--high-seconds``), the producers appending ``--high-batch``
    events per statement (10: 2,000 single ``append_event`` statements a second
    would take most of PostgreSQL's core before anything is decided; see
    docs/performance.md, "gateway"); every event of a statement counts
    from the moment the statement returned. Target: p99 <= 100 ms.

For (b) and (c) the CPU each hint cost is printed too: this process (the
daemon; the benchmark's own share is waiting on pipes) and PostgreSQL (the
postmaster and its children, the producers' appends included), over the
phase. ``--stages`` prints where the time goes (``bench/_stages.py``).

The server is the real daemon (role ``all``, the real gateway, round and job
runner) on an embedded PostgreSQL in a temporary directory, in this process.
Each connection costs one file descriptor here and one in the client process.

Usage: .venv/bin/python bench/gateway.py [--connections N] [--desktops D]
       [--rate R] [--seconds S] [--high-rate R2] [--high-seconds S2] [--stages]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import os
import resource
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _stages
from bench._common import (
    bench_database,
    machine,
    postgres_cpu,
    postgres_pid,
    process_cpu,
    report,
)
from bothy_notify.auth import mint_token
from bothy_notify.config import structure_config
from bothy_notify.push.fake import FakeProvider
from bothy_notify.wiring import Daemon
from gateway.service import Gateway, build_gateway
from testkit.ws import Closed, GatewayClient

KEY = "bench-only-hs256-key-0123456789abcdef"
CONNECT_CONCURRENCY = 200
"""Handshakes in flight at once from the client process (the listen backlog is larger)."""
PRODUCER_RATE = 400.0
"""Statements/s one producer connection makes at most: above it the load is split over
several producer processes (one ``append_event`` is a round trip plus the schema check)."""
DRAIN_WAIT = 10.0
"""Seconds a phase waits after its producers end for the last hints to arrive."""


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard one; return it."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        resident_pages = int(fh.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


# -- the client process ----------------------------------------------------------------


def client_process(pipe: Connection, address: str, idle: int, desktops: int) -> None:
    raise_file_limit()
    trio.run(_client_main, pipe, address, idle, desktops)


async def _client_main(pipe: Connection, address: str, idle: int, desktops: int) -> None:
    arrivals: dict[str, float] = {}
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
    failures = 0
    idle_clients: list[GatewayClient] = []  # held open, never read

    async def reader(ws: GatewayClient) -> None:
        nonlocal arrivals
        try:
            while True:
                frame = await ws.op()
                if frame.get("type") == "notification.created":
                    arrivals[frame["payload"]["message_id"]] = time.monotonic()
        except Closed:
            return

    async def connect(
        nursery: trio.Nursery, user: str, device: str, platform: str, read: bool
    ) -> None:
        nonlocal failures
        token = mint_token(KEY, {"sub": user, "did": device, "plat": platform, "kind": "user"})
        async with limiter:
            ws = None
            try:
                ws = await GatewayClient.open(address)
                await ws.identify(token)
            except (OSError, Closed):
                failures += 1
                if ws is not None:
                    await ws.aclose()
                return
        if read:
            nursery.start_soon(reader, ws)
        else:
            idle_clients.append(ws)

    async def command() -> str:
        message: str = await trio.to_thread.run_sync(pipe.recv)
        return message

    async with trio.open_nursery() as nursery:
        started = time.monotonic()
        async with trio.open_nursery() as starters:
            for i in range(idle):
                starters.start_soon(connect, nursery, f"idle{i}", f"idle{i}-linux", "linux", False)
        pipe.send(("idle", idle - failures, time.monotonic() - started))
        await command()
        failures = 0
        started = time.monotonic()
        async with trio.open_nursery() as starters:
            for i in range(desktops):
                starters.start_soon(connect, nursery, f"u{i}", f"u{i}-desktop", "macos", True)
        pipe.send(("desktops", desktops - failures, time.monotonic() - started))
        while (cmd := await command()) != "stop":
            if cmd == "count":
                pipe.send(len(arrivals))
            else:  # "report": this phase's arrivals
                pipe.send(arrivals)
                arrivals = {}
        nursery.cancel_scope.cancel()


# -- the producer process --------------------------------------------------------------


def producer_process(
    pipe: Connection,
    url: str,
    desktops: int,
    rate: float,
    seconds: float,
    share: tuple[int, int],
    prefix: str,
    first_seq: int,
    batch: int,
) -> None:
    """Append this producer's share (``index``, ``of``) of ``rate * seconds`` events, the
    k-th due at ``start + k / rate``, ``batch`` events per ``append_event`` statement
    (one transaction); send back when each append returned."""
    index, of = share
    total = int(rate * seconds)
    mine = list(range(index, total, of))
    appended: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        for b in range(0, len(mine), batch):
            ks = mine[b : b + batch]
            pause = start + ks[-1] / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            payloads = [
                json.dumps(
                    {
                        "thread_id": f"t{k % desktops}",
                        "message_id": f"{prefix}{k}",
                        "thread_seq": first_seq + k // desktops,
                        "author_id": "author",
                        "mentions": [],
                    }
                )
                for k in ks
            ]
            if len(payloads) == 1:
                conn.execute(
                    "SELECT bothy.append_event('message.created', %s::jsonb)", (payloads[0],)
                )
            else:
                conn.execute(
                    "SELECT bothy.append_event('message.created', p)"
                    " FROM unnest(%s::jsonb[]) WITH ORDINALITY AS u(p, i) ORDER BY i",
                    (payloads,),
                )
            returned = time.monotonic()
            for k in ks:
                appended[f"{prefix}{k}"] = returned
    pipe.send(appended)


# -- the server (this process) ---------------------------------------------------------


def seed(url: str, desktops: int) -> int:
    """People, threads, memberships and follows for the latency part; returns the last seq."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("user.upserted", {"user_id": "author", "kind": "human", "active": True})
    ]
    for i in range(desktops):
        user, thread = f"u{i}", f"t{i}"
        events += [
            ("user.upserted", {"user_id": user, "kind": "human", "active": True}),
            ("thread.upserted", {"thread_id": thread, "space_id": "space"}),
            ("member.added", {"user_id": user, "scope_id": "space"}),
            ("thread.followed", {"user_id": user, "thread_id": thread, "level": "all"}),
        ]
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.executemany(
            "SELECT bothy.append_event(%s, %s::jsonb)", [(t, json.dumps(p)) for t, p in events]
        )
        row = cur.execute("SELECT max(seq) FROM bothy.events").fetchone()
    assert row is not None
    return int(row[0])


def round_share(url: str, prefix: str) -> tuple[float, float]:
    """p50 and p99 (ms) from an event's append to its ``notify.gateway_send`` job insert,
    for the messages whose id starts with ``prefix`` (one phase).

    ``occurred_at`` is taken inside the producer's transaction and ``created_at``
    at the start of the round that decided it, both on this machine's clock.
    """
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY d)"
            " FROM (SELECT extract(epoch FROM j.created_at - e.occurred_at) * 1000 AS d"
            "  FROM bothy.jobs j JOIN bothy.events e ON e.type = 'message.created'"
            "   AND e.payload->>'message_id' = j.args->>'message_id'"
            "  WHERE j.kind = 'notify.gateway_send' AND j.args->>'message_id' LIKE %s) AS s",
            (prefix + "%",),
        ).fetchone()
    assert row is not None
    return float(row[0] or 0), float(row[1] or 0)


def consumed(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT seq FROM bothy.consumer_cursor WHERE name = 'notify'").fetchone()
    return int(row[0]) if row else 0


async def wait_consumed(url: str, seq: int) -> None:
    """Poll the consumer cursor (the round runs in this process's daemon)."""
    while True:
        if await trio.to_thread.run_sync(consumed, url) >= seq:
            return
        await trio.sleep(0.1)


async def receive(pipe: Connection) -> Any:
    return await trio.to_thread.run_sync(pipe.recv)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latency_phase(
    ctx: Any,
    url: str,
    pipe: Connection,
    desktops: int,
    rate: float,
    seconds: float,
    prefix: str,
    first_seq: int,
    postmaster: int | None,
    trace: _stages.Trace | None,
    batch: int = 1,
) -> dict[str, Any]:
    """One latency phase: producers at ``rate`` for ``seconds``, then every hint read
    (or :data:`DRAIN_WAIT` over); latencies and CPU per hint."""
    producers = max(1, math.ceil(rate / batch / PRODUCER_RATE))
    pipes, procs = [], []
    for i in range(producers):
        ppipe, pchild = ctx.Pipe()
        pipes.append(ppipe)
        procs.append(
            ctx.Process(
                target=producer_process,
                args=(
                    pchild,
                    url,
                    desktops,
                    rate,
                    seconds,
                    (i, producers),
                    prefix,
                    first_seq,
                    batch,
                ),
            )
        )
    cpu_before = process_cpu()
    pg_before = postgres_cpu(postmaster) if postmaster else 0.0
    for proc in procs:
        proc.start()
    appended: dict[str, float] = {}
    for ppipe in pipes:
        appended.update(await receive(ppipe))
    for proc in procs:
        await trio.to_thread.run_sync(proc.join)
    with trio.move_on_after(DRAIN_WAIT):
        while True:
            pipe.send("count")
            if await receive(pipe) >= len(appended):
                break
            await trio.sleep(0.05)
    cpu = process_cpu() - cpu_before
    pg = (postgres_cpu(postmaster) - pg_before) if postmaster else None
    pipe.send("report")
    arrivals: dict[str, float] = await receive(pipe)
    latencies = [(arrivals[m] - t) * 1000 for m, t in appended.items() if m in arrivals]
    out: dict[str, Any] = {
        "p50_ms": round(percentile(latencies, 0.50), 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        "rate": rate,
        "events": len(appended),
        "delivered": len(latencies),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
    }
    hints = max(1, len(latencies))
    out["daemon_cpu_us_per_hint"] = round(cpu / hints * 1e6, 1)
    out["postgres_cpu_us_per_hint"] = None if pg is None else round(pg / hints * 1e6, 1)
    out["cpu_us_per_hint"] = None if pg is None else round((cpu + pg) / hints * 1e6, 1)
    print(
        f"    {len(latencies)}/{len(appended)} delivered ({producers} producer processes);"
        f" p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms,"
        f" max {max(latencies, default=0):.1f} ms",
        flush=True,
    )
    print(
        f"    CPU per hint: daemon {out['daemon_cpu_us_per_hint']} us"
        f" + PostgreSQL {out['postgres_cpu_us_per_hint']} us (the appends included)",
        flush=True,
    )
    if trace is not None:
        print("    stages (time from the stage passed before; bench/_stages.py):", flush=True)
        for line in trace.summary(appended, arrivals):
            print(line, flush=True)
    p50, p99 = await trio.to_thread.run_sync(round_share, url, prefix)
    print(
        f"    append -> gateway job inserted (the round's start): p50 {p50:.1f} ms,"
        f" p99 {p99:.1f} ms",
        flush=True,
    )
    return out


async def serve_and_measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    config = structure_config(
        {
            "server": {
                "api_listen": "127.0.0.1:0",
                "gateway_listen": "127.0.0.1:0",
                "drain_period": "5s",
            },
            "auth": {"keys": [{"algorithm": "HS256", "key": "env:BOTHY_BENCH_KEY"}]},
            "sync": {"heartbeat": "1h", "identify_timeout": "60s"},
            "notify": {"coalesce_window": "0s", "poll_interval": "1s"},
            "push": {"fake": {}},
            "log": {"level": "warning"},
        },
        env={"BOTHY_BENCH_KEY": KEY},
    )
    trace = _stages.Trace() if args.stages else None
    daemon = Daemon(
        config,
        database_url=url,
        providers={"fake": FakeProvider()},
        gateway_factory=build_gateway,
        instrument=trace,
    )
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(daemon.run)
        gateway = daemon.gateway
        assert isinstance(gateway, Gateway) and addresses.gateway is not None
        last = await trio.to_thread.run_sync(seed, url, args.desktops)
        await wait_consumed(url, last)

        print(f"(a) {args.connections} idle connections ...", flush=True)
        pipe, child = ctx.Pipe()
        client = ctx.Process(
            target=client_process,
            args=(child, addresses.gateway, args.connections, args.desktops),
        )
        gc.collect()
        before = rss_bytes()
        client.start()
        _, idle, took = await receive(pipe)
        gc.collect()
        after = rss_bytes()
        live = gateway.hub.statistics().live
        out["connections"] = live
        out["kb_per_connection"] = round((after - before) / 1024 / max(1, live), 2)
        print(
            f"    {idle} connected in {took:.1f} s; {live} live on the server;"
            f" RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB:"
            f" {out['kb_per_connection']} KB per connection",
            flush=True,
        )

        pipe.send("desktops")
        _, desktops, took = await receive(pipe)
        print(f"    {desktops} live desktops in {took:.1f} s", flush=True)
        postmaster = postgres_pid(url)
        phases = [("b", "m", args.rate, args.seconds, "", 1)]
        if args.high_rate > 0:
            phases.append(("c", "h", args.high_rate, args.high_seconds, "high_", args.high_batch))
        first_seq = 1
        for label, prefix, rate, seconds, field, batch in phases:
            print(
                f"({label}) {args.desktops} desktops, {rate:g} message events/s for"
                f" {seconds:g} s, {batch} per append statement ...",
                flush=True,
            )
            if trace is not None:
                trace.reset()
            figures = await latency_phase(
                ctx,
                url,
                pipe,
                args.desktops,
                rate,
                seconds,
                prefix,
                first_seq,
                postmaster,
                trace,
                batch,
            )
            first_seq += int(rate * seconds) // args.desktops + 1
            out.update({field + k: v for k, v in figures.items()})
        runner = daemon.runner
        out["lost_leases"] = runner.lost_leases if runner is not None else None
        print(
            f"    job results dropped by their fence (lost leases): {out['lost_leases']}",
            flush=True,
        )
        pipe.send("stop")
        await trio.to_thread.run_sync(client.join)
        daemon.request_shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--desktops", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--high-rate", type=float, default=2000.0, help="events/s of phase (c); 0 skips it"
    )
    parser.add_argument("--high-seconds", type=float, default=5.0)
    parser.add_argument(
        "--high-batch",
        type=int,
        default=10,
        help="events per append statement in phase (c), as many producers' transactions",
    )
    parser.add_argument(
        "--stages", action="store_true", help="print per-stage timestamps (bench/_stages.py)"
    )
    args = parser.parse_args()
    limit = raise_file_limit()
    needed = args.connections + args.desktops + 200
    if needed > limit:
        parser.error(f"{needed} file descriptors needed per process, the limit is {limit}")
    started = time.monotonic()
    with bench_database() as url:
        figures = trio.run(serve_and_measure, url, args)
    print(f"machine: {machine()}; took {time.monotonic() - started:.0f} s", flush=True)
    report(
        "gateway",
        connections=figures["connections"],
        kb_per_connection=figures["kb_per_connection"],
        p50_ms=figures["p50_ms"],
        p99_ms=figures["p99_ms"],
        rate=figures["rate"],
        delivered=figures["delivered"],
        events=figures["events"],
        cpu_us_per_hint=figures["cpu_us_per_hint"],
        daemon_cpu_us_per_hint=figures["daemon_cpu_us_per_hint"],
        postgres_cpu_us_per_hint=figures["postgres_cpu_us_per_hint"],
        high_rate=figures.get("high_rate"),
        high_p50_ms=figures.get("high_p50_ms"),
        high_p99_ms=figures.get("high_p99_ms"),
        high_delivered=figures.get("high_delivered"),
        high_events=figures.get("high_events"),
        high_cpu_us_per_hint=figures.get("high_cpu_us_per_hint"),
        lost_leases=figures["lost_leases"],
    )


if __name__ == "__main__":
    main()
