"""Benchmark: the public path as an app meets it, every part in its own process.

The daemon is started as ``make run`` starts it: ``bothy-notify run --config
FILE`` (role ``all``, the embedded PostgreSQL in a temporary directory, the
fake push provider, ``sync.heartbeat`` and every other key at its default but
``notify.coalesce_window = "0s"``, so every message gives its own hint). Set-up
(people, threads, memberships, follows) goes in through ``POST /v1/events``
too. Desktops are WebSocket clients in ``--client-processes`` processes (a
process may hold 20,000 open files here): each opens the gateway, identifies,
and once ``catchup.complete`` arrived sends ``{"op":"ping"}`` every
``hello.d.heartbeat_ms`` (the first one at a random point of its first
interval, so the pings of all connections are spread evenly). ``--followers``
(1,000) of them follow (level ``all``) one thread each, the threads written
to. Producers are processes that post ONE ``message.created`` per ``POST
/v1/events`` over one HTTP/1.1 keep-alive connection each, the k-th due at
``start + k / rate`` (sent at once when the previous answer came later). CPU is
read per process from ``/proc``: the daemon's process, and PostgreSQL's
(the postmaster and its children) beside it.

Phases, in this order (figures of the closing JSON line in brackets):

(f) Floors, before the daemon has work: a bare Hypercorn POST (a trivial ASGI
    app answering a JSON POST, served by Hypercorn's Trio worker in its own
    process, fed by the same producer at ``--rate`` and at ``--high-rate``), the
    same POST through Starlette on Hypercorn (one route that reads the JSON body
    and answers a ``JSONResponse``: what the daemon's API is built on), and a
    bare wsproto ping/pong (``bench/_wsfloor.py``: a minimal wsproto server
    process, pinged by the same clients at the ping rate of the measured
    phase): CPU per request of those processes [``bare_http_*``,
    ``starlette_http_*``, ``bare_ping_*``]. The Starlette floor stays up: after
    phases (a) and (c) it is fed again at the rate that phase reached, from as
    many connections, so each phase's daemon CPU per POST has a floor of the
    same run at the same rate [``few_floor_*``, ``high_floor_*``, and
    ``*_ratio_to_floor``].
(a) ``--few`` (10) following desktops connected; ``--rate`` (200) events/s for
    ``--seconds``, over their threads [``few_*``].
(s) The storm: the other connections (``--connections`` in all, 19,000) all
    connecting at once (at most ``--storm-concurrency`` handshakes in flight,
    so that unidentified connections stay under
    ``sync.max_unidentified_connections``; a refused or evicted attempt is
    retried): seconds until the last one is ``live`` (its
    ``catchup.complete`` read) and identifies/s of the daemon's one process
    [``storm_*``].
(p) Heartbeats: the daemon's CPU over windows of ``--ping-window`` seconds with
    every connection pinging, alternated with windows where the clients hold
    their pings back (the schedule is shifted by the window, so no connection
    goes past 1.5 heartbeats): CPU per ``ping`` = (CPU/s pinging - CPU/s
    holding back) / pings/s, and the pinging connections' share of a core
    [``ping_*``].
(b) ``--rate`` events/s for ``--seconds`` with every connection heartbeating,
    over the followers' threads: append -> ``notification.created`` p50/p99
    (the client's read minus the moment the POST's answer was read, both
    CLOCK_MONOTONIC), POST p50/p99, events lost, daemon and PostgreSQL CPU per
    POST; the same CPU less the heartbeats' CPU of phase (p) [top-level
    figures]; p50 of (b) / p50 of (a) [``idle_ratio_p50``].
(c) ``--high-rate`` (2,000) events/s from ``--high-producers`` (4) connections
    for ``--high-seconds`` (30), everything still connected [``high_*``].

With ``--processes N`` the daemon runs ``server.processes = N`` node processes
(one command; the kernel spreads connections over them), and its CPU is theirs
and the parent's together.

Usage: .venv/bin/python bench/public_path.py [--connections N] [--followers F]
       [--rate R] [--seconds S] [--high-rate R2] [--high-seconds S2]
       [--client-processes P] [--processes N] [--skip PHASES] [--profile DIR]
       [--code DIR]  (the daemon runs that source tree: a before/after in one sitting)
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import multiprocessing
import os
import random
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    Profiler,
    machine,
    postgres_cpu,
    process_cpu,
    raise_file_limit,
    report,
    tree_cpu,
)
from bench._daemon import KEY, BenchDaemon, add_code_argument, bench_daemon, daemon_env
from bench._httpfloor import bare_http_process, starlette_http_process
from bench._wsfloor import floor_process
from bothy_notify.auth import mint_token
from testkit.ws import ABNORMAL, OPCODE_TEXT, PING, Closed, GatewayClient

PRODUCER_SUBJECT = "bench-producer"
DRAIN_WAIT = 10.0
"""Seconds a phase waits after its producers end for the last hints to arrive."""
WARM_SECONDS = 2.0
"""Seconds of load before phase (a) is measured (the pools grow, the code warms up)."""
CONNECT_DEADLINE = 180.0
"""Seconds a client keeps retrying to connect before it counts as failed."""
_MESSAGE_ID = re.compile(rb'"message_id":"([^"]+)"')
_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 2)


# -- WebSocket clients (their own processes) -------------------------------------------


class Clients:
    """The connections of one client process and the commands it answers."""

    def __init__(self, pipe: Connection, index: int) -> None:
        self.pipe = pipe
        self.rng = random.Random(index)
        self.streams: dict[int, GatewayClient] = {}
        self.arrivals: dict[str, float] = {}
        self.heap: list[tuple[float, int]] = []
        self.interval = 30.0
        self.heartbeat_ms: int | None = None
        self.shift = 0.0
        self.held_since: float | None = None
        self.pings = self.pongs = self.retries = self.failures = 0
        self.closes: dict[int, int] = {}
        self.group: trio.Nursery | None = None
        self.group_scope: trio.CancelScope | None = None
        self.wake = trio.Event()

    async def main(self) -> None:
        async with trio.open_nursery() as top:
            self._top = top
            top.start_soon(self.pinger)
            while True:
                command, *args = await trio.to_thread.run_sync(self.pipe.recv)
                if command == "stop":
                    break
                self.pipe.send(await getattr(self, f"do_{command}")(*args))
            top.cancel_scope.cancel()

    # commands

    async def do_connect(
        self,
        address: str,
        bare: bool,
        users: list[tuple[int, bool]],
        concurrency: int,
        start_at: float,
        interval: float | None,
    ) -> dict[str, Any]:
        """Connect ``users`` ((index, follower)) from ``start_at`` on, at most
        ``concurrency`` in flight; ``interval`` overrides the hello's heartbeat."""
        tokens = {
            i: mint_token(KEY, _device_claims(i, follower)) if not bare else ""
            for i, follower in users
        }
        if self.group is None:
            self.group_scope = await self._open_group()
        limiter = trio.CapacityLimiter(concurrency)
        retries, failures = self.retries, self.failures
        live_at: list[float] = []
        await trio.sleep_until(_trio_time(start_at))

        async def one(i: int) -> None:
            deadline = time.monotonic() + CONNECT_DEADLINE
            while True:
                async with limiter:
                    try:
                        with trio.fail_after(30):
                            client = await self._open(address, tokens[i], bare)
                        break
                    except (OSError, trio.TooSlowError, Closed):
                        self.retries += 1
                if time.monotonic() > deadline:
                    self.failures += 1
                    return
                await trio.sleep(self.rng.uniform(0.05, 0.5))
            live_at.append(time.monotonic())
            self.streams[i] = client
            self.interval = interval or (self.heartbeat_ms or 30_000) / 1000
            heapq.heappush(
                self.heap, (time.monotonic() - self.shift + self.rng.uniform(0, self.interval), i)
            )
            self.wake.set()
            assert self.group is not None
            self.group.start_soon(self._read, i, client)

        async with trio.open_nursery() as starters:
            for i, _ in users:
                starters.start_soon(one, i)
        return {
            "live": len(live_at),
            "started": start_at,
            "last_live": max(live_at, default=start_at),
            "retries": self.retries - retries,
            "failures": self.failures - failures,
            "heartbeat_ms": self.heartbeat_ms,
        }

    async def do_close(self) -> dict[str, Any]:
        """Close every connection (the floor's echo server is done with)."""
        clients = list(self.streams.values())
        self.streams.clear()
        self.heap.clear()
        if self.group_scope is not None:
            self.group_scope.cancel()
        for client in clients:
            await client.aclose()
        self.group = self.group_scope = None
        self.closes.clear()
        self.pings = self.pongs = 0
        return {}

    async def do_hold(self, held: bool) -> dict[str, Any]:
        """Hold the pings back (``True``) or send them again, the schedule shifted by
        the time they were held."""
        now = time.monotonic()
        if held and self.held_since is None:
            self.held_since = now
        elif not held and self.held_since is not None:
            self.shift += now - self.held_since
            self.held_since = None
            self.wake.set()
        return {}

    async def do_stats(self) -> dict[str, Any]:
        return {
            "pings": self.pings,
            "pongs": self.pongs,
            "open": len(self.streams),
            "closes": dict(self.closes),
            "cpu": process_cpu(),
        }

    async def do_count(self) -> int:
        return len(self.arrivals)

    async def do_arrivals(self) -> dict[str, float]:
        arrivals, self.arrivals = self.arrivals, {}
        return arrivals

    # connections

    async def _open_group(self) -> trio.CancelScope:
        ready = trio.Event()
        scope = trio.CancelScope()

        async def hold() -> None:
            with scope:
                async with trio.open_nursery() as group:
                    self.group = group
                    ready.set()
                    await trio.sleep_forever()

        assert self._top is not None
        self._top.start_soon(hold)
        await ready.wait()
        return scope

    _top: trio.Nursery | None = None

    async def _open(self, address: str, token: str, bare: bool) -> GatewayClient:
        """A connection (the kit's client: no task per connection, so one process
        holds thousands cheaply; the server side is the real thing), identified and
        caught up, or just upgraded when ``bare``."""
        client = await GatewayClient.open(address)
        try:
            if not bare:
                heartbeat_ms = await client.identify(token)
                if self.heartbeat_ms is None:
                    self.heartbeat_ms = heartbeat_ms
        except BaseException:
            await client.aclose()
            raise
        return client

    async def _read(self, i: int, client: GatewayClient) -> None:
        try:
            while True:
                messages = await client.receive()
                now = time.monotonic()
                for opcode, payload in messages:
                    if opcode != OPCODE_TEXT:
                        continue
                    if payload == b'{"op":"pong"}':
                        self.pongs += 1
                    elif b'"notification.created"' in payload:
                        found = _MESSAGE_ID.search(payload)
                        if found is not None:
                            self.arrivals.setdefault(found.group(1).decode(), now)
        except Closed as exc:
            code = 0 if exc.code == ABNORMAL else exc.code  # 0: ended without a close frame
            self.closes[code] = self.closes.get(code, 0) + 1
        except OSError:
            self.closes[-1] = self.closes.get(-1, 0) + 1
        finally:
            self.streams.pop(i, None)

    async def pinger(self) -> None:
        """Every connection's ping at its time: one task for all of them."""
        heap = self.heap
        while True:
            if self.held_since is not None or not heap:
                self.wake = trio.Event()
                await self.wake.wait()
                continue
            due = heap[0][0] + self.shift
            now = time.monotonic()
            if due > now:
                self.wake = trio.Event()
                with trio.move_on_after(due - now):
                    await self.wake.wait()
                continue
            _, i = heapq.heappop(heap)
            client = self.streams.get(i)
            if client is None:
                continue
            heapq.heappush(heap, (due - self.shift + self.interval, i))
            try:
                await client.send_frame(PING)
                self.pings += 1
            except (Closed, trio.BusyResourceError):
                continue


def _trio_time(monotonic_at: float) -> float:
    """A ``time.monotonic()`` instant on Trio's clock."""
    return trio.current_time() + (monotonic_at - time.monotonic())


def _device_claims(i: int, follower: bool) -> dict[str, str]:
    user = f"u{i}" if follower else f"idle{i}"
    platform = "macos" if follower else "linux"
    return {"sub": user, "did": f"{user}-{platform}", "plat": platform, "kind": "user"}


def client_process(pipe: Connection, index: int) -> None:
    raise_file_limit()
    trio.run(Clients(pipe, index).main)


# -- producers (their own processes) ---------------------------------------------------


class KeepAlive:
    """One HTTP/1.1 keep-alive connection: a request's bytes out, one answer in."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def post(self, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), token.encode(), len(body), body)
        )
        buffer = self._buffer
        while b"\r\n\r\n" not in buffer:
            buffer += self._receive()
        head, _, rest = buffer.partition(b"\r\n\r\n")
        found = _CONTENT_LENGTH.search(head)
        length = int(found.group(1)) if found else 0
        while len(rest) < length:
            rest += self._receive()
        self._buffer = rest[length:]
        return int(head[9:12]), rest[:length]

    def _receive(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def producer_process(
    pipe: Connection,
    address: str,
    token: str,
    plan: dict[str, Any],
) -> None:
    """Post this producer's share of a phase, one event per request: the k-th of the
    phase (k = share, share + producers, ...) due at ``start + k / rate``. Sends back
    (message id, sent, answered, status) per request."""
    pipe.send("ready")
    start: float = pipe.recv()
    # Connected once every producer is ready: on a loaded machine their start can take
    # longer than a server's keep-alive timeout, which would close an idle connection.
    conn = KeepAlive(address)
    rate, threads, first_seq = plan["rate"], plan["threads"], plan["first_seq"]
    out: list[tuple[str, float, float, int]] = []
    # A producer that falls behind stops at the phase's end plus this much: what it
    # could not send counts against the achieved rate, not as lost.
    stop_at = start + plan["total"] / rate * 1.25 + 2.0
    for k in range(plan["share"], plan["total"], plan["producers"]):
        if time.monotonic() > stop_at:
            break
        message_id = f"{plan['prefix']}{k}"
        body = json.dumps(
            {
                "events": [
                    {
                        "type": "message.created",
                        "payload": {
                            "thread_id": f"t{threads[k % len(threads)]}",
                            "message_id": message_id,
                            "thread_seq": first_seq + k // len(threads),
                            "author_id": "author",
                            "mentions": [],
                        },
                    }
                ]
            },
            separators=(",", ":"),
        ).encode()
        pause = start + k / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sent = time.monotonic()
        status, _ = conn.post("/v1/events", token, body)
        out.append((message_id, sent, time.monotonic(), status))
    conn.close()
    pipe.send(out)


# -- the run ---------------------------------------------------------------------------


def daemon_config(data_dir: Path, processes: int = 1) -> str:
    return "\n".join(
        [
            "[server]",
            'role = "all"',
            f"processes = {processes}",
            'api_listen = "127.0.0.1:0"',
            'gateway_listen = "127.0.0.1:0"',
            "[database]",
            f'data_dir = "{data_dir}"',
            "[[auth.keys]]",
            'algorithm = "HS256"',
            'key = "env:BOTHY_BENCH_KEY"',
            "[notify]",
            'coalesce_window = "0s"',
            "[push.fake]",
            "[log]",
            'level = "warning"',
            "",
        ]
    )


class Run:
    """The processes of one run and what the phases share."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.ctx = multiprocessing.get_context("spawn")
        self.token = mint_token(KEY, {"sub": PRODUCER_SUBJECT, "scope": "events:write"})
        self.clients: list[tuple[Connection, Any]] = []
        self.node: BenchDaemon | None = None
        self.postmaster: int | None = None
        self.first_seq = 1
        self.out: dict[str, Any] = {}
        self.profiles: list[str] = []
        self.floor: tuple[Any, str] | None = None
        """The Starlette floor's process and address while it is up."""

    # processes

    def start_clients(self) -> None:
        for index in range(self.args.client_processes):
            pipe, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=client_process, args=(child, index), daemon=True)
            proc.start()
            self.clients.append((pipe, proc))

    def ask(self, command: str, *args: Any) -> list[Any]:
        for pipe, _ in self.clients:
            pipe.send((command, *args))
        return [pipe.recv() for pipe, _ in self.clients]

    def connect(
        self,
        address: str,
        users: list[tuple[int, bool]],
        concurrency: int,
        *,
        bare: bool = False,
        interval: float | None = None,
    ) -> dict[str, Any]:
        """Connect ``users`` spread over the client processes, all from one instant."""
        n = len(self.clients)
        start_at = time.monotonic() + 1.0 + 0.00005 * len(users)  # tokens minted before
        for k, (pipe, _) in enumerate(self.clients):
            pipe.send(
                (
                    "connect",
                    address,
                    bare,
                    users[k::n],
                    max(1, concurrency // n),
                    start_at,
                    interval,
                )
            )
        replies = [pipe.recv() for pipe, _ in self.clients]
        return {
            "live": sum(r["live"] for r in replies),
            "seconds": max(r["last_live"] for r in replies) - start_at,
            "retries": sum(r["retries"] for r in replies),
            "failures": sum(r["failures"] for r in replies),
            "heartbeat_ms": next((r["heartbeat_ms"] for r in replies if r["heartbeat_ms"]), None),
        }

    def start_daemon(self) -> None:
        data_dir = self.workdir / "pg"
        self.node = bench_daemon(
            self.workdir, daemon_config(data_dir, self.args.processes), daemon_env(self.args)
        )
        self.node.start_sync(timeout=300)
        with open(data_dir / "postmaster.pid", encoding="ascii") as pidfile:
            self.postmaster = int(pidfile.readline())

    def stop(self) -> None:
        if self.floor is not None:
            self.floor[0].kill()
            self.floor[0].join()
            self.floor = None
        for pipe, proc in self.clients:
            with contextlib.suppress(Exception):
                pipe.send(("stop",))
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        if self.node is not None:
            self.node.stop_sync()
        if self.postmaster is not None:
            # The daemon stops its embedded server; should it not have, stop it here.
            for _ in range(100):
                if not _alive(self.postmaster):
                    break
                time.sleep(0.1)
            else:
                os.kill(self.postmaster, signal.SIGTERM)

    def daemon_cpu(self) -> tuple[float, float]:
        assert self.node is not None and self.postmaster is not None
        return self.node_cpu(), postgres_cpu(self.postmaster)

    def node_cpu(self) -> float:
        """CPU seconds of the daemon so far: its process, and with ``--processes`` N > 1
        its node processes too (the parent's children)."""
        assert self.node is not None
        if self.args.processes > 1:
            return tree_cpu(self.node.pid)
        return process_cpu(self.node.pid)

    @contextlib.contextmanager
    def profiled(self, phase: str) -> Iterator[None]:
        if not self.args.profile or self.node is None:
            yield
            return
        path = str(Path(self.args.profile) / f"{phase}.txt")
        profiler = Profiler(path, rate=100, pid=self.node.pid, gil=True)
        try:
            yield
        finally:
            print(f"  ({phase}) daemon profile:", flush=True)
            profiler.stop(top=30)

    # set-up

    def seed(self) -> None:
        """People, threads, memberships and follows, through the API; waits until the
        round consumed them."""
        assert self.node is not None
        events: list[dict[str, Any]] = [
            {
                "type": "user.upserted",
                "payload": {"user_id": "author", "kind": "human", "active": True},
            }
        ]
        for i in range(self.args.followers):
            user, thread = f"u{i}", f"t{i}"
            events += [
                {
                    "type": "user.upserted",
                    "payload": {"user_id": user, "kind": "human", "active": True},
                },
                {"type": "thread.upserted", "payload": {"thread_id": thread, "space_id": "s"}},
                {"type": "member.added", "payload": {"user_id": user, "scope_id": "s"}},
                {
                    "type": "thread.followed",
                    "payload": {"user_id": user, "thread_id": thread, "level": "all"},
                },
            ]
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=f"http://{self.node.api}", headers=headers) as http:
            for b in range(0, len(events), 1000):
                http.post("/v1/events", json={"events": events[b : b + 1000]}).raise_for_status()
        self.wait_consumed(len(events))

    def wait_consumed(self, total: int, timeout: float = 120.0) -> None:
        assert self.node is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.node.metrics().get("bothy_events_consumed_total", 0) >= total:
                return
            time.sleep(0.1)
        raise RuntimeError("the round did not consume the set-up in time")

    # phases

    def produce(
        self,
        address: str,
        rate: float,
        seconds: float,
        producers: int,
        prefix: str,
        threads: list[int],
        first_seq: int,
    ) -> tuple[list[tuple[str, float, float, int]], float]:
        """Producers posting ``rate * seconds`` events; returns their records and the
        start instant."""
        plan = {
            "rate": rate,
            "total": int(rate * seconds),
            "producers": producers,
            "prefix": prefix,
            "threads": threads,
            "first_seq": first_seq,
        }
        pipes, procs = [], []
        for share in range(producers):
            pipe, child = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=producer_process,
                args=(child, address, self.token, {**plan, "share": share}),
                daemon=True,
            )
            proc.start()
            pipes.append(pipe)
            procs.append(proc)
        for pipe in pipes:
            assert pipe.recv() == "ready"
        start = time.monotonic() + 0.2
        for pipe in pipes:
            pipe.send(start)
        records: list[tuple[str, float, float, int]] = []
        for pipe in pipes:
            records += pipe.recv()
        for proc in procs:
            proc.join(10)
        return records, start

    def latency_phase(
        self,
        label: str,
        prefix: str,
        rate: float,
        seconds: float,
        producers: int,
        threads: list[int],
    ) -> dict[str, Any]:
        """One measured phase on the daemon: latencies, losses, CPU per POST."""
        assert self.node is not None
        seq = self.first_seq
        self.first_seq += math.ceil(rate * seconds / len(threads)) + 1
        self.ask("arrivals")
        cpu0, pg0 = self.daemon_cpu()
        t0 = time.monotonic()
        with self.profiled(label):
            records, _ = self.produce(self.node.api, rate, seconds, producers, prefix, threads, seq)
            answered = {m: a for m, _s, a, status in records if status == 200}
            drain_end = time.monotonic() + DRAIN_WAIT
            while time.monotonic() < drain_end:
                if sum(self.ask("count")) >= len(answered):
                    break
                time.sleep(0.05)
        elapsed = time.monotonic() - t0
        cpu1, pg1 = self.daemon_cpu()
        arrivals: dict[str, float] = {}
        for got in self.ask("arrivals"):
            arrivals.update(got)
        latencies = [(arrivals[m] - a) * 1000 for m, a in answered.items() if m in arrivals]
        posts = [(a - s) * 1000 for _m, s, a, _status in records]
        n = max(1, len(records))
        planned = int(rate * seconds)
        figures: dict[str, Any] = {
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "post_p50_ms": percentile(posts, 0.5),
            "post_p99_ms": percentile(posts, 0.99),
            "events": len(records),
            "unsent": planned - len(records),
            "delivered": len(latencies),
            "lost": len(records) - len(latencies),
            "refused": len(records) - len(answered),
            "achieved_rate": round(len(records) / max(1e-9, seconds), 1),
            "daemon_cpu_us_per_post": round((cpu1 - cpu0) / n * 1e6, 1),
            "postgres_cpu_us_per_post": round((pg1 - pg0) / n * 1e6, 1),
            "daemon_core_share": round((cpu1 - cpu0) / elapsed, 3),
        }
        last = max((s for _m, s, _a, _st in records), default=0.0)
        first = min((s for _m, s, _a, _st in records), default=0.0)
        if last > first:
            figures["achieved_rate"] = round((len(records) - 1) / (last - first), 1)
        print(
            f"  ({label}) {figures['delivered']}/{figures['events']} delivered"
            f" ({figures['refused']} refused, {figures['unsent']} not sent in time,"
            f" {producers} producer connection(s),"
            f" {figures['achieved_rate']} posts/s): append -> notification p50"
            f" {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms; POST p50"
            f" {figures['post_p50_ms']} ms, p99 {figures['post_p99_ms']} ms\n"
            f"      CPU per POST: daemon {figures['daemon_cpu_us_per_post']} us,"
            f" PostgreSQL {figures['postgres_cpu_us_per_post']} us"
            f" (the daemon used {100 * figures['daemon_core_share']:.1f} % of a core)",
            flush=True,
        )
        return figures

    def ping_windows(self, label: str, window: float, rounds: int) -> dict[str, Any]:
        """Alternate windows pinging and holding back; CPU per ping of ``cpu``."""
        return self._ping_windows(label, window, rounds, self.node_cpu)

    def _ping_windows(self, label: str, window: float, rounds: int, cpu: Any) -> dict[str, Any]:
        on_cpu = off_cpu = on_time = off_time = 0.0
        pings = 0
        for held in [False, True] * rounds:
            self.ask("hold", held)
            before = sum(s["pings"] for s in self.ask("stats"))
            c0, t0 = cpu(), time.monotonic()
            time.sleep(window)
            c1, t1 = cpu(), time.monotonic()
            after = sum(s["pings"] for s in self.ask("stats"))
            if held:
                off_cpu, off_time = off_cpu + c1 - c0, off_time + t1 - t0
            else:
                on_cpu, on_time = on_cpu + c1 - c0, on_time + t1 - t0
                pings += after - before
        self.ask("hold", False)
        ping_rate = pings / max(1e-9, on_time)
        extra = on_cpu / on_time - off_cpu / off_time
        figures = {
            "cpu_us_per_ping": round(extra / max(1e-9, ping_rate) * 1e6, 1),
            "pings_per_s": round(ping_rate, 1),
            "core_pct": round(100 * extra, 2),
            "idle_core_pct": round(100 * off_cpu / off_time, 2),
        }
        print(
            f"  ({label}) {figures['pings_per_s']} pings/s: {figures['cpu_us_per_ping']} us of"
            f" CPU per ping, {figures['core_pct']} % of a core (holding back:"
            f" {figures['idle_core_pct']} %)",
            flush=True,
        )
        return figures

    def _start_floor(self, target: Any) -> tuple[Any, str]:
        pipe, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=target, args=(child,), daemon=True)
        proc.start()
        address: str = pipe.recv()
        return proc, address

    def _floor_post(
        self, pid: int, address: str, rate: float, seconds: float, producers: int
    ) -> tuple[float, float | None, int, int]:
        """A floor server fed ``rate`` POSTs/s: (CPU us per request, POST p50 ms,
        answered 200, sent)."""
        c0 = process_cpu(pid)
        records, _ = self.produce(address, rate, seconds, producers, "bare", [0], 1)
        c1 = process_cpu(pid)
        ok = sum(1 for r in records if r[3] == 200)
        posts = [(a - s) * 1000 for _m, s, a, _st in records]
        return round((c1 - c0) / max(1, ok) * 1e6, 1), percentile(posts, 0.5), ok, len(records)

    def floor_at(self, label: str, figures: dict[str, Any], producers: int) -> None:
        """The Starlette floor fed at the rate phase ``label`` reached, from as many
        connections: its CPU per request is that phase's floor (the same run, the
        same rate)."""
        if self.floor is None:
            self.floor = self._start_floor(starlette_http_process)
        proc, address = self.floor
        rate = figures["achieved_rate"]
        if not rate:
            return
        cpu, p50, ok, sent = self._floor_post(
            proc.pid, address, rate, _floor_seconds(rate), producers
        )
        prefix = "" if label == "b" else {"a": "few_", "c": "high_"}[label]
        self.out[f"{prefix}floor_cpu_us_per_post"] = cpu
        self.out[f"{prefix}floor_post_p50_ms"] = p50
        self.out[f"{prefix}floor_rate"] = rate
        ratio = round(figures["daemon_cpu_us_per_post"] / max(cpu, 1e-9), 2)
        self.out[f"{prefix}daemon_cpu_us_per_post_ratio_to_floor"] = ratio
        print(
            f"  ({label}) floor: Hypercorn + Starlette at {rate:g}/s ({producers}"
            f" connection(s)): {cpu} us of CPU per request, p50 {p50} ms ({ok}/{sent});"
            f" the daemon's CPU per POST is {ratio}x that",
            flush=True,
        )

    def storm(self, rest: list[tuple[int, bool]]) -> None:
        """(s) ``rest`` connecting at once."""
        assert self.node is not None and self.node.gateway is not None
        out = self.out
        print(f"(s) {len(rest)} more clients connecting at once ...", flush=True)
        c0, _ = self.daemon_cpu()
        with self.profiled("s"):
            storm = self.connect(self.node.gateway, rest, self.args.storm_concurrency)
        c1, _ = self.daemon_cpu()
        out["connections"] += storm["live"]
        out["storm_seconds"] = round(storm["seconds"], 2)
        out["storm_identifies_per_s"] = round(storm["live"] / max(1e-9, storm["seconds"]), 1)
        out["storm_retries"] = storm["retries"]
        out["storm_failures"] = storm["failures"]
        out["storm_daemon_cpu_us_per_identify"] = round((c1 - c0) / max(1, storm["live"]) * 1e6, 1)
        print(
            f"  (s) {storm['live']} live in {out['storm_seconds']} s:"
            f" {out['storm_identifies_per_s']} identifies/s in the daemon's one process"
            f" ({out['storm_daemon_cpu_us_per_identify']} us of CPU each; {storm['retries']}"
            f" attempts retried, {storm['failures']} failed)",
            flush=True,
        )

    def floors(self) -> None:
        """(f) the bare Hypercorn POST, the Starlette POST (kept up for the floors of
        the phases, :meth:`floor_at`) and the bare wsproto ping/pong."""
        args = self.args
        for name, target in [
            ("bare_http", bare_http_process),
            ("starlette_http", starlette_http_process),
        ]:
            proc, address = self._start_floor(target)
            for field, rate, producers in [
                ("", args.rate, 1),
                ("high_", args.high_rate, args.high_producers),
            ]:
                if rate <= 0:
                    continue
                seconds = max(2.0, min(5.0, 1000 / rate * 5))
                cpu, p50, ok, sent = self._floor_post(proc.pid, address, rate, seconds, producers)
                self.out[f"{name}_{field}cpu_us_per_post"] = cpu
                self.out[f"{name}_{field}post_p50_ms"] = p50
                what = "bare Hypercorn" if name == "bare_http" else "Hypercorn + Starlette"
                print(
                    f"  (f) {what} POST at {rate:g}/s ({producers} connection(s)):"
                    f" {cpu} us of CPU per request, p50 {p50} ms ({ok}/{sent})",
                    flush=True,
                )
            if name == "starlette_http":
                self.floor = (proc, address)
            else:
                proc.kill()
                proc.join()

        pipe, child = self.ctx.Pipe()
        ping_rate = args.connections / 30.0  # the default sync.heartbeat
        proc = self.ctx.Process(target=floor_process, args=(child, 30_000), daemon=True)
        proc.start()
        address = f"127.0.0.1:{pipe.recv()}"
        conns = min(args.connections, 2000)
        got = self.connect(
            address, [(i, False) for i in range(conns)], 400, bare=True, interval=conns / ping_rate
        )
        pid = proc.pid
        figures = (
            self._ping_windows("f", args.ping_window / 2, 2, lambda: process_cpu(pid))
            if got["live"]
            else {}
        )
        self.ask("close")
        pipe.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        self.out["bare_ping_cpu_us_per_ping"] = figures.get("cpu_us_per_ping")
        self.out["bare_ping_connections"] = got["live"]


def _floor_seconds(rate: float) -> float:
    """How long a phase's floor is fed: about 1,000 requests, 3 to 10 seconds."""
    return max(3.0, min(10.0, 1000 / max(rate, 1e-9)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    bench = Run(args, workdir)
    out = bench.out
    skip = set(args.skip)
    try:
        bench.start_clients()
        if "f" not in skip:
            print("(f) floors ...", flush=True)
            bench.floors()
        started = time.monotonic()
        bench.start_daemon()
        assert bench.node is not None
        print(f"daemon serving in {time.monotonic() - started:.1f} s (pid {bench.node.pid})")
        bench.seed()
        gateway = bench.node.gateway
        assert gateway is not None
        few = list(range(min(args.few, args.followers)))
        got = bench.connect(gateway, [(i, True) for i in few], len(few))
        out["heartbeat_ms"] = got["heartbeat_ms"]
        print(f"(a) {got['live']} following desktops connected; heartbeat {got['heartbeat_ms']} ms")
        bench.produce(bench.node.api, args.rate, WARM_SECONDS, 1, "warm", few, 1)
        bench.first_seq = int(args.rate * WARM_SECONDS) // len(few) + 2
        if "a" not in skip:
            few_figures = bench.latency_phase("a", "a", args.rate, args.seconds, 1, few)
            out.update({f"few_{k}": v for k, v in few_figures.items()})
            bench.floor_at("a", few_figures, 1)

        rest = [(i, i < args.followers) for i in range(len(few), args.connections)]
        out["connections"] = got["live"]
        if rest:
            bench.storm(rest)
        if "p" not in skip:
            with bench.profiled("p"):
                ping = bench.ping_windows("p", args.ping_window, 2)
            out.update({f"ping_{k}": v for k, v in ping.items()})
        followers = list(range(args.followers))
        if "b" not in skip:
            print(
                f"(b) {args.rate:g} events/s for {args.seconds:g} s, {out['connections']}"
                f" connections heartbeating, {len(followers)} following ...",
                flush=True,
            )
            figures = bench.latency_phase("b", "b", args.rate, args.seconds, 1, followers)
            out.update(figures)
            if out.get("ping_core_pct") is not None:
                # What the POSTs cost beyond holding the heartbeating connections.
                per_s = (out["ping_core_pct"] + out["ping_idle_core_pct"]) / 100
                out["daemon_cpu_us_per_post_net"] = round(
                    figures["daemon_cpu_us_per_post"] - per_s / args.rate * 1e6, 1
                )
            if out.get("few_p50_ms") and figures["p50_ms"]:
                out["idle_ratio_p50"] = round(figures["p50_ms"] / out["few_p50_ms"], 2)
        if "c" not in skip and args.high_rate > 0:
            print(
                f"(c) {args.high_rate:g} events/s from {args.high_producers} connections for"
                f" {args.high_seconds:g} s ...",
                flush=True,
            )
            figures = bench.latency_phase(
                "c", "c", args.high_rate, args.high_seconds, args.high_producers, followers
            )
            out.update({f"high_{k}": v for k, v in figures.items()})
            bench.floor_at("c", figures, args.high_producers)
        stats = bench.ask("stats")
        out["closed_by_server"] = {
            code: sum(s["closes"].get(code, 0) for s in stats)
            for code in sorted({c for s in stats for c in s["closes"]})
        }
        out["still_open"] = sum(s["open"] for s in stats)
        out["client_cpu_s"] = round(sum(s["cpu"] for s in stats), 1)
        print(
            f"connections still open {out['still_open']}, closed by the server"
            f" (code: count) {out['closed_by_server']}; client processes used"
            f" {out['client_cpu_s']} s of CPU",
            flush=True,
        )
        for field, bare in [
            ("daemon_cpu_us_per_post", "bare_http_cpu_us_per_post"),
            ("few_daemon_cpu_us_per_post", "bare_http_cpu_us_per_post"),
            ("high_daemon_cpu_us_per_post", "bare_http_high_cpu_us_per_post"),
            ("ping_cpu_us_per_ping", "bare_ping_cpu_us_per_ping"),
        ]:
            if out.get(field) and out.get(bare):
                out[f"{field}_ratio_to_bare"] = round(out[field] / out[bare], 2)
    finally:
        bench.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=19_000)
    parser.add_argument("--followers", type=int, default=1_000)
    parser.add_argument("--few", type=int, default=10, help="connections of phase (a)")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--high-rate", type=float, default=2000.0, help="0 skips phase (c)")
    parser.add_argument("--high-seconds", type=float, default=30.0)
    parser.add_argument("--high-producers", type=int, default=4)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--processes", type=int, default=1, help="server.processes of the daemon (node processes)"
    )
    parser.add_argument("--storm-concurrency", type=int, default=800)
    parser.add_argument("--ping-window", type=float, default=5.0)
    parser.add_argument(
        "--skip",
        default="",
        help="phases to leave out of f, a, p, b, c (the storm: --connections equal to --few)",
    )
    parser.add_argument(
        "--profile", metavar="DIR", help="py-spy the daemon in each phase (DIR/PHASE.txt)"
    )
    add_code_argument(parser)
    args = parser.parse_args()
    args.skip = args.skip.replace(",", "")
    limit = raise_file_limit()
    per_process = math.ceil(args.connections / args.client_processes) + 2100
    if per_process > limit:
        parser.error(f"{per_process} open files per client process; the limit is {limit}")
    if args.connections + 500 > limit:
        parser.error(f"the daemon would hold {args.connections} connections; the limit is {limit}")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bothy-bench-public-") as tmp:
        figures = run(args, Path(tmp))
    print(
        f"machine: {machine()}; load average {os.getloadavg()};"
        f" took {time.monotonic() - started:.0f} s",
        flush=True,
    )
    report("public_path", **figures)


if __name__ == "__main__":
    main()
