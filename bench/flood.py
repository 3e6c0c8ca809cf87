"""Benchmark: a flood of gateway ops against ``bothy-notify run``, and another person's HTTP.

The daemon runs as a user starts it (``bothy-notify run --config <temp toml>``,
role ``all``, the embedded PostgreSQL), in its own process. Issue 24, item 5:

- **The victim** (its own process): another person's phone asks
  ``GET /v1/preferences`` every ``--interval`` over one keep-alive
  connection, and times each answer; first for ``--seconds`` quiet, then for
  ``--seconds`` during the flood.
- **The flood** (its own process): one person's ``--connections`` connections
  send ``focus`` with ``--ids`` thread ids (readable threads of theirs) as
  fast as their sockets take them, each reading its answers meanwhile; a
  connection that is closed reconnects at once (no backoff: the worst a
  client can do) and floods again.

Reported: the victim's p50/p99 quiet and during the flood (target: p99 within
max(100 ms, 3x quiet)), the ops the flood sent and those answered
(``focus.ack``), the rest refused, how its connections were closed (4029
expected; a connection that ends without a close frame counts as 1006 and
must never happen), ``bothy_gateway_rate_limited_total``, and the daemon's and
PostgreSQL's CPU during the flood.

Usage: .venv/bin/python bench/flood.py [--connections 16] [--ids 100] [--seconds 10]
       [--interval 0.02]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import machine, report
from bench._daemon import KEY, add_code_argument, bench_daemon, daemon_env
from bothy_notify.auth import mint_token
from testkit.ws import Closed, GatewayClient, op_frame

FLOODER = "flooder"
VICTIM = "victim"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000, 2)


# -- the victim ---------------------------------------------------------------------------


def victim_process(pipe: Connection, api: str, interval: float) -> None:
    token = mint_token(KEY, {"sub": VICTIM, "did": "victim-phone", "plat": "ios", "kind": "user"})
    with httpx.Client(
        base_url=f"http://{api}", headers={"authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        client.get("/v1/preferences").raise_for_status()  # the device row, the connection
        while (command := pipe.recv()) != "stop":
            seconds = command
            latencies: list[float] = []
            statuses: dict[int, int] = {}
            end = time.monotonic() + seconds
            due = time.monotonic()
            while (now := time.monotonic()) < end:
                if due > now:
                    time.sleep(due - now)
                started = time.monotonic()
                status = client.get("/v1/preferences").status_code
                latencies.append(time.monotonic() - started)
                statuses[status] = statuses.get(status, 0) + 1
                due += interval
            pipe.send({"latencies": latencies, "statuses": statuses})


# -- the flood -----------------------------------------------------------------------------


def flood_process(pipe: Connection, gateway: str, connections: int, ids: int) -> None:
    trio.run(_flood, pipe, gateway, connections, ids)


async def _flood(pipe: Connection, gateway: str, connections: int, ids: int) -> None:
    focus = op_frame("focus", {"thread_ids": [f"ft{i}" for i in range(ids)]})
    counts = {"sent": 0, "acked": 0, "connections": 0}
    closes: dict[str, int] = {}

    async def send(ws: GatewayClient) -> None:
        try:
            while True:
                await ws.send_frame(focus)
                counts["sent"] += 1
        except Closed:
            return

    async def read(ws: GatewayClient) -> str:
        """Count the acks until the server closes; how it closed."""
        try:
            while True:
                if (await ws.op()).get("op") == "focus.ack":
                    counts["acked"] += 1
        except Closed as exc:
            return str(exc.code)

    async def one(index: int) -> None:
        token = mint_token(
            KEY, {"sub": FLOODER, "did": f"flood-{index}", "plat": "linux", "kind": "user"}
        )
        while True:
            try:
                ws = await GatewayClient.open(gateway)
            except (OSError, Closed):
                closes["refused"] = closes.get("refused", 0) + 1
                await trio.sleep(0.01)
                continue
            counts["connections"] += 1
            try:
                try:
                    await ws.identify(token)
                except Closed as exc:
                    key = str(exc.code)
                else:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(send, ws)
                        key = await read(ws)
                        nursery.cancel_scope.cancel()
                closes[key] = closes.get(key, 0) + 1
            finally:
                await ws.aclose()

    async with trio.open_nursery() as nursery:
        for i in range(connections):
            nursery.start_soon(one, i)
        await trio.to_thread.run_sync(pipe.recv)
        nursery.cancel_scope.cancel()
    pipe.send({**counts, "closes": closes})


# -- the benchmark -------------------------------------------------------------------------


def seed(api: str, ids: int) -> None:
    """The flooder reads ``ids`` threads of space ``fs``; the victim exists."""
    token = mint_token(KEY, {"sub": "backend", "scope": "events:write"})
    events: list[dict[str, Any]] = [
        {"type": "user.upserted", "payload": {"user_id": u, "kind": "human", "active": True}}
        for u in (FLOODER, VICTIM)
    ]
    events.append({"type": "member.added", "payload": {"user_id": FLOODER, "scope_id": "fs"}})
    events += [
        {"type": "thread.upserted", "payload": {"thread_id": f"ft{i}", "space_id": "fs"}}
        for i in range(ids)
    ]
    response = httpx.post(
        f"http://{api}/v1/events",
        json={"events": events},
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )
    response.raise_for_status()


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "server": {"api_listen": "127.0.0.1:0", "gateway_listen": "127.0.0.1:0"},
        "auth": {"keys": [{"algorithm": "HS256", "key": "env:BOTHY_BENCH_KEY"}]},
        "sync": {"max_focused_threads": max(100, args.ids)},
        "push": {"fake": {}},
        "log": {"level": "error"},
    }
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {}
    with bench_daemon(workdir, settings, daemon_env(args)) as daemon:
        seed(daemon.api, args.ids)
        time.sleep(2.0)  # the round applies the seed
        victim_pipe, victim_child = ctx.Pipe()
        victim = ctx.Process(target=victim_process, args=(victim_child, daemon.api, args.interval))
        victim.start()
        try:
            print(f"quiet: GET /v1/preferences every {args.interval * 1000:g} ms ...", flush=True)
            victim_pipe.send(args.seconds)
            quiet = victim_pipe.recv()
            print(
                f"flood: {args.connections} connections, focus with {args.ids} ids ...",
                flush=True,
            )
            flood_pipe, flood_child = ctx.Pipe()
            flood = ctx.Process(
                target=flood_process,
                args=(flood_child, daemon.gateway, args.connections, args.ids),
            )
            before = daemon.metrics()
            cpu, pg = daemon.cpu_seconds(), daemon.postgres_cpu()
            flood.start()
            time.sleep(1.0)  # the flood is under way
            victim_pipe.send(args.seconds)
            flooded = victim_pipe.recv()
            cpu, pg = daemon.cpu_seconds() - cpu, daemon.postgres_cpu() - pg
            flood_pipe.send("stop")
            if not flood_pipe.poll(60):
                raise RuntimeError("the flood process did not answer")
            sent = flood_pipe.recv()
            flood.join(30)
            after = daemon.metrics()
            victim_pipe.send("stop")
        finally:
            victim.join(30)
            if victim.is_alive():
                victim.kill()
        span = args.seconds + 1.0
        limited = "bothy_gateway_rate_limited_total"
        out.update(
            quiet_p50_ms=percentile(quiet["latencies"], 0.5),
            quiet_p99_ms=percentile(quiet["latencies"], 0.99),
            flood_p50_ms=percentile(flooded["latencies"], 0.5),
            flood_p99_ms=percentile(flooded["latencies"], 0.99),
            victim_statuses=flooded["statuses"],
            ops_sent=sent["sent"],
            ops_answered=sent["acked"],
            ops_refused=sent["sent"] - sent["acked"],
            flood_connections=sent["connections"],
            flood_closes=sent["closes"],
            rate_limited=after.get(limited, 0.0) - before.get(limited, 0.0),
            daemon_core_pct=round(100 * cpu / span, 1),
            postgres_core_pct=round(100 * pg / span, 1),
        )
    quiet_p99 = out["quiet_p99_ms"] or 0.0
    out["target_p99_ms"] = round(max(100.0, 3 * quiet_p99), 2)
    out["p99_within_target"] = (out["flood_p99_ms"] or 0.0) <= out["target_p99_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_code_argument(parser)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--ids", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between GETs")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bothy-flood-") as tmp:
        out = run(args, Path(tmp))
    for key, value in out.items():
        print(f"    {key}: {value}", flush=True)
    print(f"machine: {machine()}; took {time.monotonic() - started:.0f} s", flush=True)
    report("flood", **out)


if __name__ == "__main__":
    main()
