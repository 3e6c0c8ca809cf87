"""Benchmark: several nodes on one PostgreSQL (``cluster.mode = "multi"``).

Multi run: two gateway nodes (role ``api``) and a ``worker``, each a separate
``bothy-notify run`` process, on one embedded PostgreSQL. Each gateway node
holds N idle connections (10,000) and half of D active desktops (1,000 macos
desktops, each following its own thread); a producer process appends
``message.created`` at R events/s (200) spread over the D threads, while the
desktops change focus at F changes/s (100) in all (a random readable thread of
another person, idle on or off, so no hint is suppressed by it).

- latency: the client reading ``notification.created`` - ``append_event``
  returning (both ``time.monotonic()``, one clock for every process of the
  machine); p50 and p99 (targets: <= 15 ms and <= 60 ms);
- the cost of shared presence: presence write transactions per second and
  rows per second to ``bothy.presence``, and the CPU time of the presence
  publisher (``bothy_cluster_presence_cpu_seconds_total``, measured with
  ``time.thread_time`` around each batch: snapshot, encoding, statements) as
  a share of one core, over the measured window (target: < 5 %).

Single run: the same on one ``all`` node with ``cluster.mode = "single"``
(N idle connections, all D desktops, the same rates), for the ratio of the
latencies.

A process may hold 20,000 open files here, so each gateway node has its own
client process (its N idle connections and its desktops), and the single
run's node holds N + D connections.

Usage: .venv/bin/python bench/cluster.py [--idle N] [--desktops D] [--rate R]
       [--focus F] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, raise_file_limit, report
from bench._daemon import KEY, BenchDaemon, bench_daemon
from bothy_notify.auth import mint_token
from testkit.ws import Closed, GatewayClient

CONNECT_CONCURRENCY = 200
"""Handshakes in flight at once per client process (the listen backlog is larger)."""
SETTLE_SECONDS = 2.0
"""After the last append, how long the clients keep listening for late hints."""
ROLES = {"multi": [("a", "api"), ("b", "api"), ("w", "worker")], "single": [("all", "all")]}
"""(name, role) of the nodes of each run."""


# -- the nodes -------------------------------------------------------------------------


def cluster_node(name: str, workdir: Path, url: str, role: str, mode: str) -> BenchDaemon:
    """One ``bothy-notify run`` child process of a run (its role and cluster mode)."""
    settings = {
        "server": {
            "role": role,
            "api_listen": "127.0.0.1:0",
            "gateway_listen": "127.0.0.1:0",
            "drain_period": "5s",
        },
        "cluster": {"mode": mode},
        "database": {"url": "env:BOTHY_BENCH_DATABASE", "pool_size": 10},
        "auth": {"keys": [{"algorithm": "HS256", "key": "env:BOTHY_BENCH_KEY"}]},
        "sync": {"heartbeat": "1h", "identify_timeout": "60s"},
        "notify": {"coalesce_window": "0s", "poll_interval": "1s"},
        "push": {"fake": {}},
        "log": {"level": "warning"},
    }
    env = {"BOTHY_BENCH_DATABASE": url, "BOTHY_BENCH_KEY": KEY}
    return bench_daemon(workdir, settings, env, name=name)


@contextmanager
def running(nodes: list[BenchDaemon]) -> Iterator[list[BenchDaemon]]:
    """Every node started at once, each serving, and stopped at the end."""
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_serving_sync()
        yield nodes
    finally:
        for node in nodes:
            with suppress(Exception):
                node.stop_sync()


# -- the client processes --------------------------------------------------------------


async def idle_connection(address: str, token: str) -> GatewayClient:
    """A connection that identifies, waits for ``catchup.complete`` and then only stays
    open (the kit's client holds no task of its own: one client process holds
    thousands of them cheaply; the server side is the real thing)."""
    client = await GatewayClient.open(address)
    try:
        await client.identify(token)
    except BaseException:
        await client.aclose()
        raise
    return client


def client_process(
    pipe: Connection, address: str, prefix: str, idle: int, desktops: range, total: int
) -> None:
    raise_file_limit()
    trio.run(_client_main, pipe, address, prefix, idle, desktops, total)


async def _client_main(
    pipe: Connection, address: str, prefix: str, idle: int, desktops: range, total: int
) -> None:
    arrivals: dict[str, float] = {}
    sockets: dict[int, GatewayClient] = {}
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
    failures = 0
    changes = 0

    async def reader(ws: GatewayClient) -> None:
        try:
            while True:
                frame = await ws.op()
                if frame.get("type") == "notification.created":
                    arrivals[frame["payload"]["message_id"]] = time.monotonic()
        except Closed:
            return

    idle_clients: list[GatewayClient] = []

    async def connect_idle(user: str) -> None:
        nonlocal failures
        token = mint_token(
            KEY, {"sub": user, "did": f"{user}-linux", "plat": "linux", "kind": "user"}
        )
        async with limiter:
            try:
                idle_clients.append(await idle_connection(address, token))
            except (OSError, Closed):
                failures += 1

    async def connect(nursery: trio.Nursery, user: str, platform: str, index: int) -> None:
        nonlocal failures
        token = mint_token(
            KEY, {"sub": user, "did": f"{user}-{platform}", "plat": platform, "kind": "user"}
        )
        async with limiter:
            try:
                ws = await idle_connection(address, token)
                # Answered once the presence is shared with the cluster.
                await ws.send("focus", {"thread_ids": []})
                while (await ws.op()).get("op") != "focus.ack":
                    pass
            except (OSError, Closed):
                failures += 1
                return
        sockets[index] = ws
        nursery.start_soon(reader, ws)

    async def change_focus(rate: float, stop: trio.Event) -> None:
        nonlocal changes
        rng = random.Random(len(prefix))
        start = trio.current_time()
        indices = list(sockets)
        while not stop.is_set() and indices:
            i = rng.choice(indices)
            other = rng.randrange(total)
            if other == i:
                other = (other + 1) % total
            focus = {"thread_ids": [f"t{other}"], "idle": rng.random() < 0.5}
            with suppress(Closed):
                await sockets[i].send("focus", focus)
            changes += 1
            await trio.sleep_until(start + changes / rate)

    async def command() -> tuple[str, Any]:
        message: tuple[str, Any] = await trio.to_thread.run_sync(pipe.recv)
        return message

    async with trio.open_nursery() as nursery:
        started = time.monotonic()
        async with trio.open_nursery() as starters:
            for i in range(idle):
                starters.start_soon(connect_idle, f"{prefix}idle{i}")
        pipe.send(("idle", idle - failures, time.monotonic() - started))
        await command()
        failures = 0
        started = time.monotonic()
        async with trio.open_nursery() as starters:
            for i in desktops:
                starters.start_soon(connect, nursery, f"u{i}", "macos", i)
        pipe.send(("desktops", len(desktops) - failures, time.monotonic() - started))
        _, rate = await command()
        stop = trio.Event()
        nursery.start_soon(change_focus, rate, stop)
        await command()
        stop.set()
        pipe.send(("arrivals", arrivals, changes))
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


# -- one run ---------------------------------------------------------------------------


def seed(url: str, desktops: int) -> int:
    """People, threads, memberships and follows; returns the last seq."""
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


def wait_consumed(url: str, seq: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT seq FROM bothy.consumer_cursor WHERE name = 'notify'"
            ).fetchone()
            if row is not None and row[0] >= seq:
                return
            time.sleep(0.1)
    raise RuntimeError("the round did not consume the set-up in time")


def round_share(url: str) -> tuple[float, float]:
    """p50 and p99 (ms) from an event's append to its first gateway job's insert."""
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(url: str, workdir: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run: start the nodes, connect, load, and measure."""
    roles = ROLES[mode]
    nodes = [cluster_node(f"{mode}-{name}", workdir, url, role, mode) for name, role in roles]
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {}
    started = time.monotonic()
    with running(nodes):
        gateways = [n for n in nodes if n.gateway is not None]
        print(f"[{mode}] {len(nodes)} node(s) serving in {time.monotonic() - started:.1f} s")
        wait_consumed(url, seed(url, args.desktops))

        share = args.desktops // len(gateways)
        clients: list[tuple[Any, Any]] = []
        for k, node in enumerate(gateways):
            mine = range(k * share, args.desktops if k == len(gateways) - 1 else (k + 1) * share)
            pipe, child = ctx.Pipe()
            assert node.gateway is not None
            proc = ctx.Process(
                target=client_process,
                args=(child, node.gateway, f"{node.name}-", args.idle, mine, args.desktops),
            )
            proc.start()
            clients.append((pipe, proc))
        idle = [pipe.recv() for pipe, _ in clients]
        out["idle_connections"] = sum(i[1] for i in idle)
        print(
            f"[{mode}] {out['idle_connections']} idle connections in"
            f" {max(i[2] for i in idle):.1f} s"
        )
        for pipe, _ in clients:
            pipe.send(("desktops", None))
        live = [pipe.recv() for pipe, _ in clients]
        out["desktops"] = sum(d[1] for d in live)
        print(f"[{mode}] {out['desktops']} desktops live in {max(d[2] for d in live):.1f} s")

        before = {n.name: n.metrics() for n in gateways}
        cpu_before = {n.name: n.cpu_seconds() for n in nodes}
        window = time.monotonic()
        for pipe, _ in clients:
            pipe.send(("focus", args.focus / len(clients)))
        ppipe, pchild = ctx.Pipe()
        producer = ctx.Process(
            target=producer_process,
            args=(pchild, url, args.desktops, args.rate, args.seconds),
        )
        producer.start()
        appended: dict[str, float] = ppipe.recv()
        producer.join()
        time.sleep(SETTLE_SECONDS)  # late hints still arrive
        for pipe, _ in clients:
            pipe.send(("report", None))
        arrivals: dict[str, float] = {}
        changes = 0
        for pipe, _ in clients:
            _, got, changed = pipe.recv()
            arrivals.update(got)
            changes += changed
        elapsed = time.monotonic() - window
        after = {n.name: n.metrics() for n in gateways}
        cpu = {n.name: (n.cpu_seconds() - cpu_before[n.name]) / elapsed for n in nodes}
        for pipe, proc in clients:
            pipe.send(("stop", None))
            proc.join(30)

    latencies = [(arrivals[m] - t) * 1000 for m, t in appended.items() if m in arrivals]
    out["events"] = len(appended)
    out["delivered"] = len(latencies)
    out["p50_ms"] = round(percentile(latencies, 0.50), 2) if latencies else None
    out["p99_ms"] = round(percentile(latencies, 0.99), 2) if latencies else None
    out["focus_changes_per_s"] = round(changes / elapsed, 1)
    out["node_cpu_share"] = {name: round(share, 3) for name, share in cpu.items()}

    def delta(name: str) -> float:
        return sum(after[n].get(name, 0.0) - before[n].get(name, 0.0) for n in after)

    out["presence_writes_per_s"] = round(delta("bothy_cluster_presence_writes_total") / elapsed, 1)
    out["presence_rows_per_s"] = round(delta("bothy_cluster_presence_rows_total") / elapsed, 1)
    out["presence_cpu_share"] = round(
        delta("bothy_cluster_presence_cpu_seconds_total") / elapsed, 4
    )
    round_p50, round_p99 = round_share(url)
    print(
        f"[{mode}] {out['delivered']}/{out['events']} delivered; p50 {out['p50_ms']} ms,"
        f" p99 {out['p99_ms']} ms, max {max(latencies, default=0):.1f} ms;"
        f" append -> gateway job p50 {round_p50:.1f} ms, p99 {round_p99:.1f} ms"
    )
    print(
        f"[{mode}] {out['focus_changes_per_s']} focus changes/s: presence"
        f" {out['presence_writes_per_s']} writes/s, {out['presence_rows_per_s']} rows/s,"
        f" publisher CPU {out['presence_cpu_share'] * 100:.2f} % of one core (both nodes);"
        f" node CPU shares {out['node_cpu_share']}"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections per node")
    parser.add_argument("--desktops", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=200.0, help="message events/s")
    parser.add_argument("--focus", type=float, default=100.0, help="focus changes/s")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    limit = raise_file_limit()
    needed = args.idle + args.desktops + 200
    if needed > limit:
        parser.error(f"{needed} file descriptors needed per process, the limit is {limit}")
    started = time.monotonic()
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bothy-bench-cluster-") as tmp:
        for mode in ("multi", "single"):
            with bench_database() as url:
                figures[mode] = measure(url, Path(tmp), mode, args)
    multi, single = figures["multi"], figures["single"]

    def ratio(key: str) -> float | None:
        if multi[key] is None or not single[key]:
            return None
        return round(multi[key] / single[key], 2)

    print(
        f"multi/single: p50 x{ratio('p50_ms')}, p99 x{ratio('p99_ms')};"
        f" machine: {machine()}; took {time.monotonic() - started:.0f} s",
        flush=True,
    )
    report(
        "cluster",
        p50_ms=multi["p50_ms"],
        p99_ms=multi["p99_ms"],
        single_p50_ms=single["p50_ms"],
        single_p99_ms=single["p99_ms"],
        ratio_p50=ratio("p50_ms"),
        ratio_p99=ratio("p99_ms"),
        delivered=multi["delivered"],
        events=multi["events"],
        connections=multi["idle_connections"] + multi["desktops"],
        focus_changes_per_s=multi["focus_changes_per_s"],
        presence_writes_per_s=multi["presence_writes_per_s"],
        presence_rows_per_s=multi["presence_rows_per_s"],
        presence_cpu_pct=round(multi["presence_cpu_share"] * 100, 2),
    )


if __name__ == "__main__":
    main()
