"""Benchmark: heartbeating desktops and a reconnect storm, against ``bothy-notify run``.

The daemon runs as a user starts it (``bothy-notify run --config <temp toml>``,
role ``all``, the embedded PostgreSQL), in its own process; the WebSocket
clients run in ``--client-processes`` separate processes (one process may hold
at most 20,000 open files), each connection a socket and one task
(``testkit/ws.py``) that sends ``{"op":"ping"}`` at the interval its
``hello`` gives (``heartbeat_ms``), from a random offset after it went live.

(1) Ten connections, one of them a probe that pings five times a second and
    times each ``pong``: the pong round trip with 10 connections.
(2) Reconnect storm: every client process opens its share of ``--connections``
    at once (at most ``--in-flight`` handshakes in flight per process; a
    refused or evicted attempt retries after a jittered 0.5-1.5 s, as a
    client's backoff would). The storm lasts from the start until the last
    ``catchup.complete``: identifies/s per daemon process, daemon and
    PostgreSQL CPU per identify. The clients heartbeat from the moment each
    is live.
(3) Heartbeating: daemon CPU over ``--beats`` heartbeat intervals with every
    connection pinging, and the probe's pong round trip meanwhile (with all
    connected; target: p50 within 1.2x of (1)).
(4) Quiet: every client holds its pings for ``--quiet`` seconds (less than
    the heartbeat grace), daemon CPU meanwhile. CPU per ping = (CPU/s of (3) -
    CPU/s of (4)) / pings/s of (3).
(5) The floor: the same clients against a bare wsproto ping/pong server process
    (``bench/_wsfloor.py``), (2) to (4) again; our figures as ratios to its.

Targets (issue 19): a ping <= 50 us of daemon CPU (19,000 connections at the
default ``sync.heartbeat`` take <= 5 % of a core); 19,000 clients all live
within 15 s of the storm's start; the pong round trip does not grow with idle
connections. CPU is read per process from ``/proc``.

Usage: .venv/bin/python bench/heartbeat.py [--connections N] [--client-processes P]
       [--heartbeat 30s] [--beats B] [--quiet S] [--in-flight F] [--no-floor]
       [--profile DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import random
import resource
import sys
import tempfile
import time
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Profiler, machine, machine_busy, process_cpu, report
from bench._daemon import KEY, add_code_argument, bench_daemon, daemon_env
from bench._wsfloor import floor_process
from bothy_notify.auth import mint_token
from bothy_notify.config import SyncConfig
from testkit.ws import ABNORMAL, PING, Closed, GatewayClient

PROBE_INTERVAL = 0.2
"""Seconds between the probe's pings (5/s: within the default ops_per_second)."""
PROBE_SECONDS = 5.0
"""How long each pong round-trip sample lasts."""
ATTEMPTS = 30
"""Connection attempts a client makes before it gives up."""
DEFAULT_HEARTBEAT: float = SyncConfig().heartbeat.total_seconds()
"""``sync.heartbeat``'s default, in seconds."""


def raise_file_limit() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the client processes --------------------------------------------------------------


class Clients:
    """One client process's connections to one server, and what they measured."""

    def __init__(self) -> None:
        self.sent: list[float] = []  # time.monotonic() of every ping sent
        self.pongs = 0
        self.closes: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.live: list[float] = []
        self.rtts: list[tuple[float, float]] = []  # (sent, round trip s) of the probe
        self.pause = (0.0, 0.0)  # trio time window in which no ping is sent
        self.all_live = trio.Event()
        self.expected = 0

    def paused(self, now: float) -> float:
        """Seconds to wait if ``now`` is inside the pause, else 0."""
        start, end = self.pause
        return end - now if start <= now < end else 0.0


async def connect(
    host: str, port: int, token: str, state: Clients, limiter: trio.CapacityLimiter
) -> tuple[GatewayClient, int] | None:
    """Connect and identify, retrying after refusals; ``None`` after :data:`ATTEMPTS`."""
    for _ in range(ATTEMPTS):
        async with limiter:
            ws: GatewayClient | None = None
            try:
                ws = await GatewayClient.open(f"{host}:{port}")
                heartbeat_ms = await ws.identify(token)
                return ws, heartbeat_ms
            except Closed as exc:
                reason = f"close {exc.code}" if exc.code != ABNORMAL else "dropped"
            except OSError as exc:
                reason = type(exc).__name__
            if ws is not None:
                await ws.aclose()
        state.failures[reason] = state.failures.get(reason, 0) + 1
        await trio.sleep(random.uniform(0.5, 1.5))
    return None


async def heartbeat(ws: GatewayClient, interval: float, state: Clients, *, probe: bool) -> None:
    """Ping at ``interval`` (the probe: every :data:`PROBE_INTERVAL`) until closed."""
    gap = PROBE_INTERVAL if probe else interval
    due = trio.current_time() + (gap if probe else random.uniform(0, interval))
    try:
        while True:
            await trio.sleep_until(due)
            if wait := state.paused(trio.current_time()):
                due += wait
                continue
            sent = time.monotonic()
            state.sent.append(sent)
            await ws.send_frame(PING)
            while (await ws.op()).get("op") != "pong":
                pass
            state.pongs += 1
            if probe:
                state.rtts.append((sent, time.monotonic() - sent))
            # A client that fell behind (its process starved) skips the beats it
            # missed rather than sending them in a burst.
            due = max(due + gap, trio.current_time())
    except Closed as exc:
        key = str(exc.code) if exc.code != ABNORMAL else "abnormal"
        state.closes[key] = state.closes.get(key, 0) + 1
    finally:
        await ws.aclose()


async def client_connection(
    host: str,
    port: int,
    token: str,
    state: Clients,
    limiter: trio.CapacityLimiter,
    *,
    probe: bool = False,
) -> None:
    opened = await connect(host, port, token, state, limiter)
    if opened is None:
        state.expected -= 1
    else:
        state.live.append(time.monotonic())
    if len(state.live) >= state.expected:
        state.all_live.set()
    if opened is not None:
        ws, heartbeat_ms = opened
        await heartbeat(ws, heartbeat_ms / 1000, state, probe=probe)


def mint(user: str) -> str:
    """A desktop's identify token (one device per person)."""
    return mint_token(KEY, {"sub": user, "did": f"{user}-desktop", "plat": "macos", "kind": "user"})


def client_process(pipe: Connection, users: list[str], in_flight: int) -> None:
    raise_file_limit()
    trio.run(_client_main, pipe, users, in_flight)


async def _client_main(pipe: Connection, users: list[str], in_flight: int) -> None:
    tokens = [mint(u) for u in users]
    limiter = trio.CapacityLimiter(in_flight)
    states: dict[str, Clients] = {}
    scopes: dict[str, trio.CancelScope] = {}
    pipe.send("ready")
    async with trio.open_nursery() as nursery:

        async def run_group(name: str, address: str, group: list[str], probe: bool) -> None:
            host, _, port = address.rpartition(":")
            state = states[name]
            with trio.CancelScope() as scopes[name]:
                async with trio.open_nursery() as conns:
                    for i, token in enumerate(group):
                        conns.start_soon(
                            partial(
                                client_connection,
                                host,
                                int(port),
                                token,
                                state,
                                limiter,
                                probe=probe and i == 0,
                            )
                        )

        while True:
            command, *params = await trio.to_thread.run_sync(pipe.recv)
            if command == "connect":  # name, address, which tokens ("all" or a count), probe
                name, address, which, probe = params
                group = tokens if which == "all" else [mint(f"{name}{i}") for i in range(which)]
                state = states[name] = Clients()
                state.expected = len(group)
                nursery.start_soon(run_group, name, address, group, probe)
                await state.all_live.wait()
                pipe.send(
                    {
                        "live": len(state.live),
                        "last_live": max(state.live, default=None),
                        "failures": state.failures,
                        "cpu": time.process_time(),
                    }
                )
            elif command == "pause":  # seconds
                now = trio.current_time()
                for state in states.values():
                    state.pause = (now, now + params[0])
                pipe.send("paused")
            elif command == "count":  # start, end (time.monotonic())
                start, end = params
                pipe.send(
                    {
                        "pings": sum(
                            1 for s in states.values() for t in s.sent if start <= t < end
                        ),
                        "rtts": [r for s in states.values() for t, r in s.rtts if start <= t < end],
                        "closes": {k: v for s in states.values() for k, v in s.closes.items()},
                        "pongs": sum(s.pongs for s in states.values()),
                    }
                )
            elif command == "close":  # name
                scope = scopes.pop(params[0], None)
                if scope is not None:
                    scope.cancel()
                states.pop(params[0], None)
                await trio.sleep(0.5)
                pipe.send("closed")
            else:  # stop
                nursery.cancel_scope.cancel()
                pipe.send("stopped")
                return


# -- the benchmark (this process) ------------------------------------------------------


class ClientFleet:
    """The client processes, each holding its share of the people."""

    def __init__(self, connections: int, processes: int, in_flight: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        users = [f"u{i}" for i in range(connections)]
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for p in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=client_process, args=(child, users[p::processes], in_flight))
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        for pipe in self.pipes:
            assert pipe.recv() == "ready"

    def all(self, *command: Any) -> list[Any]:
        for pipe in self.pipes:
            pipe.send(command)
        return [pipe.recv() for pipe in self.pipes]

    def cpu(self) -> float:
        """CPU seconds the client processes used so far."""
        return sum(process_cpu(proc.pid) for proc in self.procs)

    def first(self, *command: Any) -> Any:
        self.pipes[0].send(command)
        return self.pipes[0].recv()

    def count(self, start: float, end: float) -> dict[str, Any]:
        replies = self.all("count", start, end)
        closes: dict[str, int] = {}
        for r in replies:
            for k, v in r["closes"].items():
                closes[k] = closes.get(k, 0) + v
        return {
            "pings": sum(r["pings"] for r in replies),
            "rtts": [x for r in replies for x in r["rtts"]],
            "closes": closes,
        }

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def storm(fleet: ClientFleet, address: str, cpu: Any, pg_cpu: Any) -> dict[str, Any]:
    """Every client process opens its share at once; until the last ``catchup.complete``."""
    cpu_before, pg_before = cpu(), pg_cpu()
    clients_before = fleet.cpu()
    busy_before = machine_busy()
    started = time.monotonic()
    replies = fleet.all("connect", "main", address, "all", False)
    clients = sum(r["cpu"] for r in replies) - clients_before
    busy_after = machine_busy()
    cpu_used, pg_used = cpu() - cpu_before, pg_cpu() - pg_before
    live = sum(r["live"] for r in replies)
    ends = [r["last_live"] for r in replies if r["last_live"] is not None]
    took = max(ends) - started if ends else float("nan")
    failures: dict[str, int] = {}
    for r in replies:
        for k, v in r["failures"].items():
            failures[k] = failures.get(k, 0) + v
    return {
        "live": live,
        "seconds": round(took, 2),
        "identifies_per_s": round(live / took, 1) if live else 0.0,
        "cpu_us_per_identify": round(cpu_used / max(1, live) * 1e6, 1),
        "postgres_cpu_us_per_identify": round(pg_used / max(1, live) * 1e6, 1),
        "clients_cpu_us_per_identify": round(clients / max(1, live) * 1e6, 1),
        "machine_busy_pct": round(
            100 * (busy_after[0] - busy_before[0]) / max(1.0, busy_after[1] - busy_before[1]), 1
        ),
        "failures": failures,
    }


def beats(
    fleet: ClientFleet, cpu: Any, interval: float, count: float, quiet: float
) -> dict[str, Any]:
    """CPU while every connection heartbeats, then while all hold their pings."""
    time.sleep(1.0)
    start, cpu_start = time.monotonic(), cpu()
    time.sleep(interval * count)
    end, cpu_end = time.monotonic(), cpu()
    beating = fleet.count(start, end)
    fleet.all("pause", quiet)
    paused = time.monotonic()
    time.sleep(0.05)
    q_start, q_cpu_start = time.monotonic(), cpu()
    time.sleep(max(0.1, quiet - 0.2))
    q_end, q_cpu_end = time.monotonic(), cpu()
    held = fleet.count(q_start, q_end)
    time.sleep(max(0.0, paused + quiet + 0.2 - time.monotonic()))
    busy = (cpu_end - cpu_start) / (end - start)
    idle = (q_cpu_end - q_cpu_start) / (q_end - q_start)
    rate = beating["pings"] / (end - start)
    return {
        "pings": beating["pings"],
        "pings_per_s": round(rate, 1),
        "core_pct_beating": round(100 * busy, 2),
        "core_pct_quiet": round(100 * idle, 2),
        "pings_while_quiet": held["pings"],
        "cpu_us_per_ping": round((busy - idle) / rate * 1e6, 1) if rate else None,
        # All the daemon's CPU while beating over the pings: an upper bound that holds
        # even when the quiet window was not quiet.
        "cpu_us_per_ping_gross": round(busy / rate * 1e6, 1) if rate else None,
        "rtts": beating["rtts"],
        "closes": beating["closes"],
    }


def rtt_ms(samples: list[float]) -> dict[str, float | None]:
    p50, p99 = percentile(samples, 0.5), percentile(samples, 0.99)
    return {
        "p50": None if p50 is None else round(p50 * 1000, 3),
        "p99": None if p99 is None else round(p99 * 1000, 3),
        "n": len(samples),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"connections": args.connections}
    sync: dict[str, Any] = {}
    if args.heartbeat:
        sync["heartbeat"] = args.heartbeat
    settings: dict[str, Any] = {
        "server": {
            "api_listen": "127.0.0.1:0",
            "gateway_listen": "127.0.0.1:0",
            "drain_period": "5s",
        },
        "auth": {"keys": [{"algorithm": "HS256", "key": "env:BOTHY_BENCH_KEY"}]},
        "notify": {"poll_interval": "1s"},
        "push": {"fake": {}},
        "log": {"level": "warning"},
    }
    if sync:
        settings["sync"] = sync
    fleet = ClientFleet(args.connections, args.client_processes, args.in_flight)
    ctx = multiprocessing.get_context("spawn")
    floor_pipe, floor_child = ctx.Pipe()
    floor: Any = None
    try:
        with bench_daemon(workdir, settings, daemon_env(args)) as daemon:
            assert daemon.gateway is not None
            print(f"daemon pid {daemon.pid}, gateway ws://{daemon.gateway}", flush=True)
            print("(1) 10 connections, the probe's pong round trip ...", flush=True)
            fleet.first("connect", "small", daemon.gateway, 10, True)
            time.sleep(1.0)
            start = time.monotonic()
            time.sleep(PROBE_SECONDS)
            small = fleet.count(start, time.monotonic())
            out["rtt_10_ms"] = rtt_ms(small["rtts"])
            print(f"    pong round trip with 10 connected: {out['rtt_10_ms']}", flush=True)

            print(f"(2) storm: {args.connections} clients connect at once ...", flush=True)
            spy = (
                Profiler(str(args.profile / "storm.txt"), 200, daemon.pid) if args.profile else None
            )
            out["storm"] = storm(fleet, daemon.gateway, daemon.cpu_seconds, daemon.postgres_cpu)
            if spy is not None:
                spy.stop(top=30)
            print(f"    {out['storm']}", flush=True)
            interval = args.heartbeat_seconds or DEFAULT_HEARTBEAT
            print(
                f"(3)+(4) heartbeating at {interval:g} s for {args.beats:g} intervals,"
                f" then {args.quiet:g} s quiet ...",
                flush=True,
            )
            spy = (
                Profiler(str(args.profile / "heartbeat.txt"), 200, daemon.pid)
                if args.profile
                else None
            )
            beat = beats(fleet, daemon.cpu_seconds, interval, args.beats, args.quiet)
            if spy is not None:
                spy.stop(top=30)
            out["rtt_all_ms"] = rtt_ms(beat.pop("rtts"))
            out["heartbeat"] = beat
            print(f"    {beat}", flush=True)
            print(f"    pong round trip with all connected: {out['rtt_all_ms']}", flush=True)
            try:
                metrics = daemon.metrics()
            except httpx.HTTPError:  # a daemon too busy to answer in time: no close counts
                metrics = {}
            out["closed"] = {
                k: v for k, v in metrics.items() if k.startswith("bothy_gateway_closed_total")
            }
            fleet.all("close", "main")
            fleet.first("close", "small")
        if args.floor:
            print("(5) the floor: a bare wsproto ping/pong server ...", flush=True)
            floor = ctx.Process(target=floor_process, args=(floor_child, int(interval * 1000)))
            floor.start()
            if not floor_pipe.poll(60):
                raise RuntimeError("the floor server did not start")
            address = f"127.0.0.1:{floor_pipe.recv()}"

            def floor_cpu() -> float:
                return process_cpu(floor.pid)

            out["floor_storm"] = storm(fleet, address, floor_cpu, lambda: 0.0)
            print(f"    {out['floor_storm']}", flush=True)
            floor_beat = beats(fleet, floor_cpu, interval, args.beats, args.quiet)
            floor_beat.pop("rtts")
            out["floor_heartbeat"] = floor_beat
            print(f"    {floor_beat}", flush=True)
            fleet.all("close", "main")
    finally:
        fleet.stop()
        if floor is not None:
            floor_pipe.send("stop")
            floor.join(10)
            if floor.is_alive():
                floor.kill()
    return out


def parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * units[unit]
    raise argparse.ArgumentTypeError(f"not a duration: {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_code_argument(parser)
    parser.add_argument("--connections", type=int, default=19_000)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--heartbeat", default="", help="sync.heartbeat of the daemon (default: its default)"
    )
    parser.add_argument("--beats", type=float, default=1.0, help="heartbeat intervals measured")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds the pings are held")
    parser.add_argument("--in-flight", type=int, default=200, help="handshakes per process")
    parser.add_argument("--no-floor", dest="floor", action="store_false")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output directory")
    args = parser.parse_args()
    args.heartbeat_seconds = parse_duration(args.heartbeat) if args.heartbeat else None
    interval = args.heartbeat_seconds or DEFAULT_HEARTBEAT
    if args.quiet > 0.4 * interval:
        parser.error("--quiet must stay below 0.4 heartbeat intervals (the grace is 1.5)")
    limit = raise_file_limit()
    per_process = args.connections // args.client_processes + 50
    if per_process > limit or args.connections + 500 > limit:
        parser.error(f"{per_process} files per client process needed, the limit is {limit}")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bothy-heartbeat-") as tmp:
        out = run(args, Path(tmp))
    ping = out["heartbeat"]["cpu_us_per_ping"]
    floor = out.get("floor_heartbeat", {}).get("cpu_us_per_ping")
    storm_ = out["storm"]
    floor_storm = out.get("floor_storm", {})
    rtt10, rtt_all = out["rtt_10_ms"]["p50"], out["rtt_all_ms"]["p50"]
    figures = {
        "connections": out["connections"],
        "heartbeat_s": interval,
        "cpu_us_per_ping": ping,
        "cpu_us_per_ping_gross": out["heartbeat"]["cpu_us_per_ping_gross"],
        "floor_cpu_us_per_ping": floor,
        "ping_ratio_to_floor": round(ping / floor, 2) if ping and floor else None,
        "heartbeat_core_pct": round(ping * out["connections"] / interval / 1e4, 2)
        if ping
        else None,
        "core_pct_beating": out["heartbeat"]["core_pct_beating"],
        "core_pct_quiet": out["heartbeat"]["core_pct_quiet"],
        "pings": out["heartbeat"]["pings"],
        "storm_live": storm_["live"],
        "storm_s": storm_["seconds"],
        "identifies_per_s_per_process": storm_["identifies_per_s"],
        "cpu_us_per_identify": storm_["cpu_us_per_identify"],
        # What one daemon process identifies per second of its own CPU: the storm's
        # rate on a machine where the daemon has a core to itself.
        "identifies_per_cpu_s": round(1e6 / storm_["cpu_us_per_identify"])
        if storm_["cpu_us_per_identify"]
        else None,
        "storm_machine_busy_pct": storm_["machine_busy_pct"],
        "postgres_cpu_us_per_identify": storm_["postgres_cpu_us_per_identify"],
        "storm_failures": storm_["failures"],
        "floor_storm_s": floor_storm.get("seconds"),
        "floor_cpu_us_per_identify": floor_storm.get("cpu_us_per_identify"),
        "rtt_p50_ms_10": rtt10,
        "rtt_p50_ms_all": rtt_all,
        "rtt_ratio": round(rtt_all / rtt10, 2) if rtt10 and rtt_all else None,
        "rtt_p99_ms_all": out["rtt_all_ms"]["p99"],
        "closes_seen_by_clients": out["heartbeat"]["closes"],
    }
    print(f"machine: {machine()}; took {time.monotonic() - started:.0f} s", flush=True)
    print(json.dumps(out.get("closed", {})), flush=True)
    report("heartbeat", **figures)


if __name__ == "__main__":
    main()
