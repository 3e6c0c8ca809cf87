"""Benchmark: memory over a long run of two nodes (issue 24, item 6).

Two ``bothy-notify run --config FILE`` processes (``cluster.mode = "multi"``,
role ``all``) on one embedded PostgreSQL, each with the memory diagnostic on
(``BOTHY_NOTIFY_MEMORY_TRACE``, ``docs/operations.md``, "Memory diagnostics").
In their own processes:

- **the producer** posts ``message.created`` at ``--rate`` events/s (20) with
  ``POST /v1/events``, one event per request, alternating between the nodes,
  into threads the people follow (level ``all``): each message is a hint for
  its thread's followers;
- **the desktops** (one process per node): ``--desktops`` people's desktops
  (half on each node) identify, ping at the hello's ``heartbeat_ms`` and read
  their hints; every minute ``--churn`` of them (a fifth) disconnect and
  reconnect;
- **the phones**: every person has a phone registered on the ``fake``
  provider, so each hint not taken by a desktop is a push.

Reported: RSS per node every minute (as it goes), the growth from the end of the
``--warmup`` minutes to the end in % (target: <= 5 %) and its slope (MB/min,
least squares over the minutes after the warm-up), and per node the top
``tracemalloc`` growers between the two (SIGUSR2 at the warm-up's end and at the
end). Tracing costs memory of its own (a larger RSS); ``--no-trace``
runs without it, for the RSS figures alone.

Usage: .venv/bin/python bench/soak.py [--minutes 30] [--warmup 5] [--rate 20]
       [--people 100] [--threads 50] [--desktops 60] [--churn 0.2] [--no-trace]
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
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_database, machine, report
from bench._daemon import KEY, BenchDaemon
from bothy_notify.auth import mint_token
from testkit.daemon import write_settings
from testkit.ws import PING, Closed, GatewayClient

TARGET_PCT = 5.0
TOP = 8
"""Growers per node in the report."""


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


# -- the nodes -------------------------------------------------------------------------


class Node(BenchDaemon):
    def __init__(self, name: str, workdir: Path, url: str, trace: bool) -> None:
        config = "\n".join(
            [
                "[server]",
                'role = "all"',
                'api_listen = "127.0.0.1:0"',
                'gateway_listen = "127.0.0.1:0"',
                'drain_period = "5s"',
                "[cluster]",
                'mode = "multi"',
                "[database]",
                'url = "env:BOTHY_BENCH_DATABASE"',
                "pool_size = 10",
                "[[auth.keys]]",
                'algorithm = "HS256"',
                'key = "env:BOTHY_BENCH_KEY"',
                "[sync]",
                'heartbeat = "10s"',
                "[notify]",
                'coalesce_window = "0s"',
                "[push.fake]",
                "[log]",
                'level = "warning"',
            ]
        )
        self.trace = workdir / f"{name}-memtrace.json"
        env = {"BOTHY_BENCH_DATABASE": url, "BOTHY_BENCH_KEY": KEY}
        if trace:
            env["BOTHY_NOTIFY_MEMORY_TRACE"] = str(self.trace)
        super().__init__(
            config_file=write_settings(workdir / f"{name}.toml", config + "\n"),
            log_file=workdir / f"{name}.log",
            env=env,
            cwd=workdir,
        )

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def memory_report(self, timeout: float = 300.0) -> dict[str, Any] | None:
        """SIGUSR2, then the report the node writes (``None`` without tracing)."""
        if "BOTHY_NOTIFY_MEMORY_TRACE" not in self.env:
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
    pipe: Connection, apis: list[str], threads: int, rate: float, sent: Synchronized[int]
) -> None:
    clients = [httpx.Client(base_url=f"http://{api}", timeout=30) for api in apis]
    auth = {"authorization": f"Bearer {backend_token()}"}
    errors = 0
    k = 0
    start = time.monotonic()
    while not pipe.poll():
        thread = k % threads
        payload = {
            "thread_id": f"t{thread}",
            "message_id": f"m{k}",
            "thread_seq": k // threads + 1,
            "author_id": "author",
            "mentions": [],
        }
        try:
            response = clients[k % len(clients)].post(
                "/v1/events",
                json={"events": [{"type": "message.created", "payload": payload}]},
                headers=auth,
            )
            if response.status_code != 200:
                errors += 1
        except httpx.HTTPError:
            errors += 1
        k += 1
        sent.value = k
        pause = start + k / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    pipe.send({"sent": k, "errors": errors})


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
                except (OSError, Closed):
                    closes["refused"] = closes.get("refused", 0) + 1
                    await trio.sleep(1.0)
                    continue
                try:
                    heartbeat_ms = await ws.identify(token)
                    connects.value += 1
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(heartbeat, ws, heartbeat_ms / 1000)
                        await read(ws)
                except Closed as exc:
                    key = str(exc.code)
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
        if churn > 0:
            nursery.start_soon(churner)
        await trio.to_thread.run_sync(pipe.recv)
        nursery.cancel_scope.cancel()
    pipe.send({"closes": closes, "pings": pings})


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


def run(args: argparse.Namespace, workdir: Path, url: str) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    nodes = [Node(name, workdir, url, not args.no_trace) for name in ("a", "b")]
    out: dict[str, Any] = {}
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_serving_sync()
        print(f"2 nodes serving (pids {', '.join(str(n.pid) for n in nodes)})", flush=True)
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
            )
            proc.start()
            desktops.append((pipe, proc))
        ppipe, pchild = ctx.Pipe()
        producer = ctx.Process(
            target=producer_process,
            args=(pchild, [n.api for n in nodes], args.threads, args.rate, sent),
        )
        producer.start()
        started = time.monotonic()
        print(
            f"load: {args.rate:g} events/s, {args.desktops} desktops (churn"
            f" {args.churn:.0%}/min), {args.people} phones; {args.minutes} min,"
            f" warm-up {args.warmup} min",
            flush=True,
        )
        series: dict[str, list[tuple[float, float]]] = {n.name: [] for n in nodes}
        at_warmup: dict[str, float] = {}
        traces_start: dict[str, dict[str, Any] | None] = {}
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
        at_end = {n: s[-1][1] for n, s in series.items()}
        traces_end = {n.name: n.memory_report() for n in nodes}
        ppipe.send("stop")
        produced = ppipe.recv()
        producer.join(30)
        ends = []
        for pipe, proc in desktops:
            pipe.send("stop")
            ends.append(pipe.recv())
            proc.join(30)
        metrics = {n.name: n.metrics() for n in nodes}
    finally:
        for node in nodes:
            node.stop_sync()

    closes: dict[str, int] = {}
    for end in ends:
        for key, count in end["closes"].items():
            closes[key] = closes.get(key, 0) + count

    def pushes(name: str) -> float:
        return sum(
            v
            for k, v in metrics[name].items()
            if k.startswith("bothy_push_sends_total") and 'outcome="delivered"' in k
        )

    out.update(
        minutes=args.minutes,
        warmup_minutes=args.warmup,
        rate=args.rate,
        events_sent=produced["sent"],
        event_errors=produced["errors"],
        desktop_connects=connects.value,
        desktop_closes=closes,
        pings=sum(e["pings"] for e in ends),
        hints=hints.value,
        pushes_delivered={n: pushes(n) for n in metrics},
        traced=not args.no_trace,
        rss_mb_warmup={n: round(v, 1) for n, v in at_warmup.items()},
        rss_mb_end={n: round(v, 1) for n, v in at_end.items()},
        growth_pct={n: round(100 * (at_end[n] - at_warmup[n]) / at_warmup[n], 2) for n in at_end},
        slope_mb_per_min={
            n: None if (v := slope(s[args.warmup :])) is None else round(v, 3)
            for n, s in series.items()
        },
        rss_mb_per_minute={n: [round(y, 1) for _, y in s] for n, s in series.items()},
        tracemalloc={n: growers(traces_start.get(n), traces_end[n]) for n in traces_end},
    )
    out["within_target"] = all(g <= TARGET_PCT for g in out["growth_pct"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="minutes before the baseline")
    parser.add_argument("--rate", type=float, default=20.0, help="message events/s")
    parser.add_argument("--people", type=int, default=100, help="people, each with a phone")
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--desktops", type=int, default=60, help="people with a desktop too")
    parser.add_argument("--churn", type=float, default=0.2, help="desktops reconnecting a minute")
    parser.add_argument("--no-trace", action="store_true", help="no tracemalloc in the nodes")
    args = parser.parse_args()
    if not 1 <= args.warmup < args.minutes:
        parser.error("--warmup must be at least 1 and below --minutes")
    if args.desktops > args.people:
        parser.error("--desktops must be at most --people")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bothy-soak-") as tmp, bench_database() as url:
        out = run(args, Path(tmp), url)
    print(f"growth after the warm-up: {out['growth_pct']} % (target <= {TARGET_PCT:g} %)")
    print(f"slope: {out['slope_mb_per_min']} MB/min")
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
