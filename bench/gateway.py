"""Benchmark: the WebSocket gateway, with its clients in a separate process.

(a) Memory: a client process opens N authenticated idle connections (each one
    hello -> identify -> catchup.complete); the server's resident memory
    before and after gives KB per connection (targets: >= 10,000 connections
    in one process at <= 25 KB each).
(b) Latency: D desktops (macos, one followed thread each) are live; a producer
    process appends ``message.created`` events with ``bothy.append_event`` at
    R events/s spread over the D threads; the client process records when each
    ``notification.created`` arrives. Latency = arrival - the moment
    ``append_event`` returned, both on ``time.monotonic()`` (CLOCK_MONOTONIC is
    one clock for every process of the machine). Targets: p50 <= 10 ms,
    p99 <= 50 ms at 200 events/s over 1,000 desktops.

The server is the real daemon (role ``all``, the real gateway, round and job
runner) on an embedded PostgreSQL in a temporary directory, in this process.
Each connection costs one file descriptor here and one in the client process.

Usage: .venv/bin/python bench/gateway.py [--connections N] [--desktops D]
       [--rate R] [--seconds S]
"""

from __future__ import annotations

import argparse
import gc
import json
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
import trio_websocket

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, report
from bothy_notify.auth import mint_token
from bothy_notify.config import structure_config
from bothy_notify.push.fake import FakeProvider
from bothy_notify.wiring import Daemon
from gateway.service import Gateway, build_gateway

KEY = "bench-only-hs256-key-0123456789abcdef"
CONNECT_CONCURRENCY = 200
"""Handshakes in flight at once from the client process (the listen backlog is larger)."""


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
    host, _, port = address.rpartition(":")
    arrivals: dict[str, float] = {}
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
    failures = 0

    async def reader(ws: trio_websocket.WebSocketConnection) -> None:
        try:
            while True:
                frame = json.loads(await ws.get_message())
                if frame.get("type") == "notification.created":
                    arrivals[frame["payload"]["message_id"]] = time.monotonic()
        except trio_websocket.ConnectionClosed:
            return

    async def connect(
        nursery: trio.Nursery, user: str, device: str, platform: str, read: bool
    ) -> None:
        nonlocal failures
        token = mint_token(KEY, {"sub": user, "did": device, "plat": platform, "kind": "user"})
        async with limiter:
            try:
                stream = await trio.open_tcp_stream(host, int(port))
                ws = await trio_websocket.wrap_client_stream(nursery, stream, host, "/v1/gateway")
                await ws.get_message()  # hello
                await ws.send_message(json.dumps({"op": "identify", "d": {"token": token}}))
                while json.loads(await ws.get_message()).get("op") != "catchup.complete":
                    pass
            except (OSError, trio_websocket.HandshakeError, trio_websocket.ConnectionClosed):
                failures += 1
                return
        if read:
            nursery.start_soon(reader, ws)

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
        await command()
        pipe.send(("arrivals", arrivals))
        await command()
        nursery.cancel_scope.cancel()


# -- the producer process --------------------------------------------------------------


def producer_process(
    pipe: Connection, url: str, desktops: int, rate: float, seconds: float
) -> None:
    total = int(rate * seconds)
    appended: dict[str, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        for k in range(total):
            message_id = f"m{k}"
            payload = {
                "thread_id": f"t{k % desktops}",
                "message_id": message_id,
                "thread_seq": k // desktops + 1,
                "author_id": "author",
                "mentions": [],
            }
            conn.execute(
                "SELECT bothy.append_event('message.created', %s::jsonb)", (json.dumps(payload),)
            )
            appended[message_id] = time.monotonic()
            pause = start + (k + 1) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
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


def round_share(url: str) -> tuple[float, float]:
    """p50 and p99 (ms) from an event's append to its ``notify.gateway_send`` job insert.

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
            "  WHERE j.kind = 'notify.gateway_send') AS s"
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
    daemon = Daemon(
        config, database_url=url, providers={"fake": FakeProvider()}, gateway_factory=build_gateway
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

        print(
            f"(b) {args.desktops} desktops, {args.rate:g} message events/s for"
            f" {args.seconds:g} s ...",
            flush=True,
        )
        pipe.send("desktops")
        _, desktops, took = await receive(pipe)
        print(f"    {desktops} desktops live in {took:.1f} s", flush=True)
        ppipe, pchild = ctx.Pipe()
        producer = ctx.Process(
            target=producer_process, args=(pchild, url, args.desktops, args.rate, args.seconds)
        )
        producer.start()
        appended: dict[str, float] = await receive(ppipe)
        await trio.to_thread.run_sync(producer.join)
        await trio.sleep(2.0)  # let the last hints arrive
        pipe.send("report")
        _, arrivals = await receive(pipe)
        latencies = [(arrivals[m] - t) * 1000 for m, t in appended.items() if m in arrivals]
        out["p50_ms"] = round(percentile(latencies, 0.50), 2) if latencies else None
        out["p99_ms"] = round(percentile(latencies, 0.99), 2) if latencies else None
        out["events"] = len(appended)
        out["delivered"] = len(latencies)
        out["mean_ms"] = round(statistics.fmean(latencies), 2) if latencies else None
        print(
            f"    {len(latencies)}/{len(appended)} delivered; p50 {out['p50_ms']} ms,"
            f" p99 {out['p99_ms']} ms, max {max(latencies, default=0):.1f} ms",
            flush=True,
        )
        p50, p99 = await trio.to_thread.run_sync(round_share, url)
        print(
            f"    of which append -> gateway job inserted (the consumer round): p50 {p50:.1f} ms,"
            f" p99 {p99:.1f} ms; the rest is the job runner, the job's checks, the publish"
            " (one access query), the write and the client",
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
    )


if __name__ == "__main__":
    main()
