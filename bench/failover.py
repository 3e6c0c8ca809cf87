"""Benchmark: PostgreSQL failovers under load on a real Patroni cluster (issue 35).

One command: installs what it needs with apt-get when missing (``etcd-server``,
``patroni``, ``postgresql-15``; as root), then, all on 127.0.0.1 in a
temporary directory (its own data directories and ports: Debian's own cluster
on 5432 is neither used nor touched):

- **the cluster**: one etcd (its v2 API, ``--enable-v2``; Patroni's ``etcd:``
  client, not ``etcd3:``) and three Patroni nodes running PostgreSQL 15 in
  synchronous mode (``synchronous_mode: true``), ``primary_start_timeout: 0``
  (a killed primary fails over instead of being restarted in place), and a
  short ``ttl`` / ``loop_wait`` / ``retry_timeout`` (:data:`TTL`,
  :data:`LOOP_WAIT`, :data:`RETRY_TIMEOUT`: Patroni's smallest sound ``ttl``,
  and a fast loop, so a frozen leader loses its key about ``ttl`` seconds
  after it froze);
- **Bothy**: two ``bothy-notify run`` nodes (role ``all``, ``cluster.mode =
  "multi"``, the ``[database]`` defaults) on the libpq multi-host URL
  ``postgresql://bothy:...@pg1,pg2,pg3/bothy?target_session_attrs=read-write``;
- **the load**: ``--rate`` single-event ``POST /v1/events`` a second (20,
  alternating between the nodes, each request on its own so a slow answer
  holds up no other), ``--desktops`` heartbeating desktops (20, WebSocket
  clients, half on each node, each following one of ``--threads`` threads),
  ``--phones`` phones (50, the ``fake`` provider, every send written to
  ``push.fake.record_file``), following the threads too: each message is a
  desktop hint for its thread's desktops and a push to its thread's phones.

Then the faults, one at a time, each with the leader placed first in turn at
each position of the URL (a planned switchover with synchronous mode briefly
off places it; that is not measured): ``kill`` (SIGKILL of the leader's
postmaster), ``switchover`` (``patronictl switchover`` to the synchronous
standby), ``freeze`` (SIGSTOP of the leader's PostgreSQL processes and its
Patroni for ``--freeze`` seconds (45), then SIGCONT). Each fault's window
runs from 5 s before it until both Bothy nodes have been ready for a while and
the cluster is whole again (the old leader streaming as a replica).

Reported per fault (and position), from what the clients saw, the fake
provider's record and the new primary's tables once the load stopped and the
jobs drained:

- ``lost``: POSTs answered 200 whose event is not in the new primary's log
  (target 0);
- ``pushes_missing``: (phone, message) pairs of acknowledged events with no
  send in the record (target 0); ``pushes_repeated``: pairs sent more than
  once (0 for a switchover; counted for kill and freeze, and explained from
  the ``notify.push_send`` jobs of those pairs: their claim, attempt and
  last error);
- ``posts_503``, ``posts_failed`` (no answer, or another status) and
  ``slowest_s``: the slowest POST of the window (target <= 10 s);
- ``ready_after_s``: from the new primary's first write (a probe commits on
  every member every 0.1 s) until both nodes' ``/readyz`` answer 200 and
  keep answering it (target <= 10 s);
- ``desktop_gap_s``: the longest time a desktop received no hint, counted
  from the new primary's first write (target <= 15 s; while no server takes
  writes no event can be appended, so the gap across the outage itself is
  reported apart as ``desktop_gap_outage_s``), and desktop disconnections.

Usage: .venv/bin/python bench/failover.py [--faults kill,switchover,freeze]
       [--positions 1,2,3] [--rate 20] [--desktops 20] [--phones 50]
       [--threads 10] [--freeze 45] [--keep] [--code DIR]

``--code DIR`` runs the Bothy nodes from another source tree (a before/after in
one sitting); the cluster and the clients are the same.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from bench._common import machine, report
from bench._daemon import KEY, BenchDaemon, add_code_argument, daemon_env
from bothy_notify.auth import mint_token
from bothy_notify.store.migrate import migrate
from testkit.daemon import cluster_node_settings, write_settings
from testkit.ws import PING, Closed, GatewayClient, ProtocolError

TTL = 20
"""Patroni's ``ttl``: a leader that stops renewing its key loses it after this many
seconds (later Patroni releases refuse less than 20)."""
LOOP_WAIT = 2
"""Patroni's ``loop_wait``: seconds between its HA loop's runs."""
RETRY_TIMEOUT = 5
"""Patroni's ``retry_timeout`` (``loop_wait + 2 * retry_timeout <= ttl``)."""
PACKAGES = {
    "etcd-server": "/usr/bin/etcd",
    "patroni": "/usr/bin/patroni",
    "postgresql-15": "/usr/lib/postgresql/15/bin/postgres",
}
"""Debian packages and a file each installs."""
BIN_DIR = "/usr/lib/postgresql/15/bin"
PASSWORDS = {"postgres": "bench-super", "replicator": "bench-repl", "rewinder": "bench-rewind"}
BOTHY_PASSWORD = "bench-bothy"
NO_PRIMARY = 180.0
"""Seconds a fault's window waits for another member to take writes; past it the
window is reported without a new primary and the run goes on once the cluster is
whole again."""
PRE_WINDOW = 5.0
"""Seconds of each fault's window before the fault."""
STABLE = 15.0
"""Seconds the cluster must stay whole with the same roles before a fault."""
SETTLE = 20.0
"""Seconds the window runs on after both nodes are ready again (and at least after
the new primary's first write), so late hints and stalls show."""


# -- installing ------------------------------------------------------------------------


def ensure_packages() -> None:
    missing = [pkg for pkg, path in PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"install {' '.join(missing)} (Debian packages) first, as root")
    print(f"installing {' '.join(missing)} with apt-get", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        check=True,
        env=env,
    )


def versions() -> dict[str, str]:
    def first_line(command: list[str]) -> str:
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        return (out.stdout or out.stderr).splitlines()[0].strip()

    return {
        "etcd": first_line(["etcd", "--version"]),
        "patroni": first_line(["patroni", "--version"]),
        "postgresql": first_line([f"{BIN_DIR}/postgres", "--version"]),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the cluster -----------------------------------------------------------------------


def run_as() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: as root, etcd and Patroni run as ``postgres``."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam("postgres")
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def chown_tree(path: Path) -> None:
    ids = run_as()
    if not ids:
        return
    for root, dirs, files in os.walk(path):
        for name in [Path(root), *(Path(root) / d for d in dirs), *(Path(root) / f for f in files)]:
            os.chown(name, ids["user"], ids["group"])


@dataclass
class Member:
    """One Patroni node and its PostgreSQL."""

    name: str
    workdir: Path
    etcd_port: int
    pg_port: int = field(default_factory=free_port)
    rest_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.workdir / self.name

    @property
    def config_file(self) -> Path:
        return self.workdir / f"{self.name}.yml"

    def write_config(self) -> None:
        config = {
            "scope": "bothy-failover",
            "name": self.name,
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_port}",
                "connect_address": f"127.0.0.1:{self.rest_port}",
            },
            "etcd": {"host": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "synchronous_mode": True,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "parameters": {
                            "synchronous_commit": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "512MB",
                            "max_connections": 200,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data_dir),
                "bin_dir": BIN_DIR,
                "pgpass": str(self.workdir / f"{self.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": PASSWORDS["postgres"]},
                    "replication": {
                        "username": "replicator",
                        "password": PASSWORDS["replicator"],
                    },
                    "rewind": {"username": "rewinder", "password": PASSWORDS["rewinder"]},
                },
                "parameters": {
                    "unix_socket_directories": str(self.workdir),
                    "shared_buffers": "64MB",
                },
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
        }
        self.config_file.write_text(json.dumps(config, indent=1))  # JSON is YAML

    def start(self) -> None:
        self.write_config()
        chown_tree(self.workdir)
        with (self.workdir / f"{self.name}-patroni.log").open("ab") as out:
            self.process = subprocess.Popen(
                ["patroni", str(self.config_file)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **run_as(),
            )

    def rest(self, path: str, timeout: float = 1.0) -> Any:
        return httpx.get(f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout).json()

    def postmaster(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def postgres_pids(self) -> list[int]:
        """The postmaster and its children."""
        postmaster = self.postmaster()
        if postmaster is None:
            return []
        pids = [postmaster]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with suppress(OSError):
                    stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[1]) == postmaster:
                        pids.append(int(entry))
        return pids

    def signal_all(self, sig: signal.Signals) -> None:
        """``sig`` to Patroni and every PostgreSQL process of this member."""
        targets = [self.process.pid] if self.process is not None else []
        if sig == signal.SIGSTOP:
            targets += self.postgres_pids()  # Patroni first: it sees nothing stop
        else:
            targets = self.postgres_pids() + targets
        for pid in targets:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)

    def url(self, dbname: str = "postgres") -> str:
        return (
            f"host=127.0.0.1 port={self.pg_port} dbname={dbname} user=postgres"
            f" password={PASSWORDS['postgres']} connect_timeout=2"
        )

    def stop(self) -> None:
        self.signal_all(signal.SIGCONT)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for pid in self.postgres_pids():  # a postmaster Patroni left behind
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class Cluster:
    """etcd and three Patroni members."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.etcd_port = free_port()
        self.etcd_peer = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.members = [Member(f"pg{i + 1}", workdir, self.etcd_port) for i in range(3)]

    def start(self) -> None:
        etcd_dir = self.workdir / "etcd"
        etcd_dir.mkdir()
        chown_tree(self.workdir)
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        with (self.workdir / "etcd.log").open("ab") as out:
            self.etcd = subprocess.Popen(
                [
                    *("etcd", "--name", "e1", "--data-dir", str(etcd_dir)),
                    *("--listen-client-urls", client, "--advertise-client-urls", client),
                    *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                    *("--initial-cluster", f"e1={peer}", "--enable-v2=true"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **run_as(),
            )
        wait_until(lambda: _etcd_up(client), 60, "etcd")
        self.members[0].start()
        wait_until(lambda: self.leader() == "pg1", 120, "pg1 bootstrapping")
        for member in self.members[1:]:
            member.start()
        self.wait_whole(300)

    def view(self) -> dict[str, dict[str, Any]]:
        """Members by name from the first Patroni that answers ``/cluster``."""
        for member in self.members:
            with suppress(httpx.HTTPError, ValueError):
                found = member.rest("/cluster")
                return {m["name"]: m for m in found.get("members", [])}
        return {}

    def leader(self) -> str | None:
        for name, m in self.view().items():
            if m.get("role") == "leader" and m.get("state") == "running":
                return name
        return None

    def whole(self) -> bool:
        """A running leader, a synchronous standby, and every replica streaming."""
        view = self.view()
        if len(view) != 3:
            return False
        roles = Counter(m.get("role") for m in view.values())
        if roles["leader"] != 1 or roles["sync_standby"] != 1:
            return False
        for m in view.values():
            if m.get("state") not in ("running", "streaming"):
                return False
            lag = m.get("lag", 0)
            if m.get("role") != "leader" and (not isinstance(lag, int) or lag > 1 << 20):
                return False
        return True

    def wait_whole(self, timeout: float) -> None:
        wait_until(self.whole, timeout, "the cluster whole (a leader, a sync standby, streaming)")

    def wait_stable(self, timeout: float) -> None:
        """Whole, with the same leader and synchronous standby, for :data:`STABLE`
        seconds: Patroni may pick another synchronous standby a few loops after it
        named one, and a leader killed meanwhile has no standby it may promote."""
        deadline = time.monotonic() + timeout
        seen: tuple[str, ...] | None = None
        since = time.monotonic()
        while time.monotonic() < deadline:
            view = self.view() if self.whole() else {}
            roles = tuple(sorted(f"{n}:{m.get('role')}" for n, m in view.items()))
            if not roles or roles != seen:
                seen, since = roles or None, time.monotonic()
            elif time.monotonic() - since >= STABLE:
                return
            time.sleep(0.5)
        raise RuntimeError("timed out waiting for the cluster whole and stable")

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def patronictl(self, *args: str) -> None:
        subprocess.run(
            ["patronictl", "-c", str(self.members[0].config_file), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def multi_host(self, user: str, password: str, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        return (
            f"postgresql://{user}:{password}@{hosts}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def stop(self) -> None:
        for member in self.members:
            member.signal_all(signal.SIGCONT)
        for member in self.members:
            member.stop()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(30)
            except subprocess.TimeoutExpired:
                self.etcd.kill()


def _etcd_up(client: str) -> bool:
    try:
        return httpx.get(f"{client}/v2/keys", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(predicate: Any, timeout: float, what: str, every: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


# -- probes ----------------------------------------------------------------------------


class WriteProbe:
    """A thread per member commits a row every 0.1 s; the times each member took a
    write (a member that does not answer holds up only its own thread)."""

    def __init__(self, members: list[Member]) -> None:
        self.writes: dict[str, list[float]] = {m.name: [] for m in members}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._probe, args=(m,), daemon=True) for m in members
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def first_write(self, name: str, after: float) -> float | None:
        return next((t for t in self.writes[name] if t >= after), None)

    def _probe(self, member: Member) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(member.url(), autocommit=True)
                conn.execute("INSERT INTO bench_probe VALUES (now(), %s)", (member.name,))
                self.writes[member.name].append(time.monotonic())
            except psycopg.Error:
                if conn is not None and conn.broken:
                    conn = None
            self._stop.wait(0.1)


class ReadySampler:
    """A thread per Bothy node asks ``/readyz`` every 0.25 s: (time, answered 200), and
    the checks that were false (``"no answer"`` when it did not answer)."""

    def __init__(self, nodes: list[BenchDaemon]) -> None:
        self.samples: dict[str, list[tuple[float, bool]]] = {n.name: [] for n in nodes}
        self.failing: dict[str, dict[float, list[str]]] = {n.name: {} for n in nodes}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._sample, args=(n,), daemon=True) for n in nodes
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def ready(self) -> bool:
        return all(s and s[-1][1] for s in self.samples.values())

    def _sample(self, node: BenchDaemon) -> None:
        with httpx.Client(timeout=3) as client:
            while not self._stop.is_set():
                at = time.monotonic()
                try:
                    response = client.get(f"http://{node.api}/readyz")
                    ok = response.status_code == 200
                    if not ok:
                        checks = response.json().get("checks", {})
                        self.failing[node.name][at] = sorted(k for k, v in checks.items() if not v)
                except (httpx.HTTPError, ValueError):
                    ok = False
                    self.failing[node.name][at] = ["no answer"]
                self.samples[node.name].append((at, ok))
                self._stop.wait(0.25)


# -- Bothy -----------------------------------------------------------------------------


def bothy_node(name: str, workdir: Path, url: str, env: dict[str, str]) -> BenchDaemon:
    config = cluster_node_settings(workdir / f"{name}-pushes.jsonl", fake_keep=0)
    return BenchDaemon(
        config_file=write_settings(workdir / f"{name}.toml", config),
        log_file=workdir / f"{name}.log",
        env={"BOTHY_BENCH_DATABASE": url, **env},
        cwd=workdir,
    )


def backend_token() -> str:
    return mint_token(KEY, {"sub": "backend", "scope": "events:write"})


def user_token(user: str, device: str, platform: str) -> str:
    return mint_token(KEY, {"sub": user, "did": device, "plat": platform, "kind": "user"})


def seed(api: str, args: argparse.Namespace) -> None:
    """Desktop people d<i> and phone people p<i>, each following thread t<i % threads>;
    every phone person's phone registered on the fake provider."""
    events: list[dict[str, Any]] = [
        {"type": "user.upserted", "payload": {"user_id": "author", "kind": "human", "active": True}}
    ]
    events += [
        {"type": "thread.upserted", "payload": {"thread_id": f"t{t}", "space_id": "failover"}}
        for t in range(args.threads)
    ]
    people = [f"d{i}" for i in range(args.desktops)] + [f"p{i}" for i in range(args.phones)]
    for user in people:
        events += [
            {
                "type": "user.upserted",
                "payload": {"user_id": user, "kind": "human", "active": True},
            },
            {"type": "member.added", "payload": {"user_id": user, "scope_id": "failover"}},
            {
                "type": "thread.followed",
                "payload": {
                    "user_id": user,
                    "thread_id": f"t{int(user[1:]) % args.threads}",
                    "level": "all",
                },
            },
        ]
    with httpx.Client(base_url=f"http://{api}", timeout=60) as client:
        auth = {"authorization": f"Bearer {backend_token()}"}
        for start in range(0, len(events), 500):
            client.post(
                "/v1/events", json={"events": events[start : start + 500]}, headers=auth
            ).raise_for_status()
        for i in range(args.phones):
            token = user_token(f"p{i}", f"p{i}-phone", "ios")
            client.post(
                "/v1/registrations",
                json={"provider": "fake", "token": f"phone-{i}"},
                headers={"authorization": f"Bearer {token}"},
            ).raise_for_status()


def producer_process(pipe: Connection, apis: list[str], threads: int, rate: float) -> None:
    trio.run(_produce, pipe, apis, threads, rate)


async def _produce(pipe: Connection, apis: list[str], threads: int, rate: float) -> None:
    """One POST per event, each in its own task: (k, node, sent, seconds, status)."""
    results: list[tuple[int, int, float, float, str]] = []
    auth = {"authorization": f"Bearer {backend_token()}"}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    clients = [
        httpx.AsyncClient(base_url=f"http://{api}", timeout=60, limits=limits) for api in apis
    ]

    async def post(k: int) -> None:
        payload = {
            "thread_id": f"t{k % threads}",
            "message_id": f"m{k}",
            "thread_seq": k // threads + 1,
            "author_id": "author",
            "mentions": [],
        }
        node = k % len(clients)
        sent = time.monotonic()
        try:
            response = await clients[node].post(
                "/v1/events",
                json={"events": [{"type": "message.created", "payload": payload}]},
                headers=auth,
            )
            status = str(response.status_code)
        except httpx.TimeoutException:
            status = "timeout"
        except httpx.HTTPError:
            status = "error"
        results.append((k, node, sent, time.monotonic() - sent, status))

    stop = trio.Event()

    async def until_told() -> None:
        await trio.to_thread.run_sync(pipe.recv)
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(until_told)
        async with trio.open_nursery() as posts:
            start = trio.current_time()
            k = 0
            while not stop.is_set():
                posts.start_soon(post, k)
                k += 1
                await trio.sleep_until(start + k / rate)
        nursery.cancel_scope.cancel()
    for client in clients:
        await client.aclose()
    pipe.send(results)


def desktop_process(pipe: Connection, gateway: str, users: list[str]) -> None:
    trio.run(_desktops, pipe, gateway, users)


async def _desktops(pipe: Connection, gateway: str, users: list[str]) -> None:
    """Each desktop identifies, pings at the hello's interval, reads its hints and
    reconnects when closed: its hints' arrival times and its disconnections."""
    arrivals: dict[str, list[float]] = {u: [] for u in users}
    received: Counter[tuple[str, str]] = Counter()  # (desktop, message) -> hints
    closes: list[tuple[str, float, str]] = []

    async def heartbeat(ws: GatewayClient, every: float) -> None:
        while True:
            await trio.sleep(every)
            await ws.send_frame(PING)

    async def desktop(user: str) -> None:
        token = user_token(user, f"{user}-desktop", "linux")
        while True:
            try:
                ws = await GatewayClient.open(gateway)
            except (OSError, Closed):
                closes.append((user, time.monotonic(), "refused"))
                await trio.sleep(0.5)
                continue
            try:
                heartbeat_ms = await ws.identify(token)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(heartbeat, ws, heartbeat_ms / 1000)
                    while True:
                        frame = await ws.op()
                        if frame.get("type") == "notification.created":
                            arrivals[user].append(time.monotonic())
                            message = frame.get("payload", {}).get("message_id")
                            received[(user, str(message))] += 1
            except (Closed, ProtocolError) as exc:
                code = exc.code if isinstance(exc, Closed) else "protocol"
                closes.append((user, time.monotonic(), str(code)))
                await trio.sleep(0.5)
            finally:
                await ws.aclose()

    async with trio.open_nursery() as nursery:
        for user in users:
            nursery.start_soon(desktop, user)
        await trio.to_thread.run_sync(pipe.recv)
        nursery.cancel_scope.cancel()
    repeated = [[user, message, n] for (user, message), n in received.items() if n > 1]
    pipe.send({"arrivals": arrivals, "closes": closes, "repeated": repeated})


# -- the faults ------------------------------------------------------------------------


@dataclass
class Window:
    fault: str
    position: int
    old: str
    start: float
    fault_at: float
    new: str | None = None
    writes_at: float | None = None
    thawed_at: float | None = None
    end: float = 0.0


def place_leader(cluster: Cluster, name: str) -> None:
    """Make ``name`` the leader (not measured): synchronous mode off, a switchover,
    synchronous mode on, and wait for the cluster whole."""
    leader = cluster.leader()
    if leader == name:
        return
    print(f"  placing the leader on {name} (from {leader})", flush=True)
    cluster.patronictl("edit-config", "--force", "-s", "synchronous_mode=false")
    wait_until(
        lambda: all(m.get("role") != "sync_standby" for m in cluster.view().values()),
        60,
        "synchronous mode off",
    )
    cluster.patronictl("switchover", "--leader", str(leader), "--candidate", name, "--force")
    wait_until(lambda: cluster.leader() == name, 120, f"{name} leading")
    cluster.patronictl("edit-config", "--force", "-s", "synchronous_mode=true")


def run_fault(
    cluster: Cluster,
    probe: WriteProbe,
    sampler: ReadySampler,
    fault: str,
    position: int,
    freeze: float,
) -> Window:
    target = cluster.members[position - 1].name
    place_leader(cluster, target)
    cluster.wait_stable(300)
    wait_until(sampler.ready, 120, "both nodes ready before the fault")
    time.sleep(PRE_WINDOW)
    view = cluster.view()
    old = next(n for n, m in view.items() if m.get("role") == "leader")
    standby = next(n for n, m in view.items() if m.get("role") == "sync_standby")
    member = cluster.member(old)
    window = Window(fault, position, old, time.monotonic() - PRE_WINDOW, time.monotonic())
    print(f"[{fault} @{position}] leader {old} (sync standby {standby})", flush=True)
    if fault == "kill":
        postmaster = member.postmaster()
        assert postmaster is not None
        os.kill(postmaster, signal.SIGKILL)
    elif fault == "switchover":
        cluster.patronictl("switchover", "--leader", old, "--candidate", standby, "--force")
    elif fault == "freeze":
        member.signal_all(signal.SIGSTOP)
    else:
        raise ValueError(fault)

    def new_writes() -> bool:
        """Another member took a write; or, after a kill, the old one did once Patroni
        restarted it in place (it may when no synchronous standby may be promoted)."""
        for m in cluster.members:
            since = window.fault_at
            if m.name == old:
                if fault != "kill":
                    continue
                since += 1.0  # the postmaster is dead at once: a later write is a restart
            first = probe.first_write(m.name, since)
            if first is not None:
                window.new, window.writes_at = m.name, first
                return True
        return False

    try:
        wait_until(new_writes, NO_PRIMARY, "a new primary taking writes", every=0.05)
        assert window.writes_at is not None
        print(
            f"[{fault} @{position}] {window.new} takes writes"
            f" {window.writes_at - window.fault_at:.1f} s after the fault",
            flush=True,
        )
    except RuntimeError:
        print(f"[{fault} @{position}] no other member took writes in {NO_PRIMARY:g} s", flush=True)
    if fault == "freeze":
        time.sleep(max(0.0, window.fault_at + freeze - time.monotonic()))
        member.signal_all(signal.SIGCONT)
        window.thawed_at = time.monotonic()
        print(f"[{fault} @{position}] {old} thawed", flush=True)
    with suppress(RuntimeError):
        wait_until(sampler.ready, 120, "both nodes ready")
    settle_from = max(time.monotonic(), window.thawed_at or 0.0)
    time.sleep(max(0.0, settle_from + SETTLE - time.monotonic()))
    window.end = time.monotonic()
    cluster.wait_whole(300)
    return window


# -- the analysis ----------------------------------------------------------------------


def ready_after(samples: list[tuple[float, bool]], since: float, until: float) -> float | None:
    """Seconds from ``since`` until the node answered 200 from then on to ``until``
    (``None``: not ready at ``until``)."""
    inside = [(t, ok) for t, ok in samples if since <= t <= until]
    if not inside or not inside[-1][1]:
        return None
    last_bad = max((t for t, ok in inside if not ok), default=None)
    if last_bad is None:
        return 0.0
    after = next(t for t, ok in inside if t > last_bad and ok)
    return after - since


def longest_gap(times: list[float], start: float, end: float) -> float:
    inside = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def analyse(
    window: Window,
    posts: list[tuple[int, int, float, float, str]],
    logged: set[str],
    sends: Counter[tuple[str, str]],
    jobs: dict[tuple[str, str], list[tuple[str, int, int, str | None]]],
    token_of: dict[str, str],
    sampler: ReadySampler,
    desktops: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    since = window.writes_at if window.writes_at is not None else window.fault_at
    mine = [p for p in posts if window.start <= p[2] <= window.end]
    acked = [p for p in mine if p[4] == "200"]
    lost = [p for p in acked if f"m{p[0]}" not in logged]
    phones_of: dict[int, list[str]] = defaultdict(list)
    for i in range(args.phones):
        phones_of[i % args.threads].append(f"phone-{i}")
    missing = 0
    for k, *_ in acked:
        missing += sum(1 for t in phones_of[k % args.threads] if (t, f"m{k}") not in sends)
    messages = {f"m{p[0]}" for p in mine}
    repeated = {pair: n for pair, n in sends.items() if n > 1 and pair[1] in messages}
    registration_of = {token: reg for reg, token in token_of.items()}
    why: Counter[str] = Counter()
    for token, message in repeated:
        rows = jobs.get((registration_of.get(token, ""), message), [])
        if len(rows) != 1:
            why[f"{len(rows)} jobs"] += 1
        else:
            state, attempt, claim, error = rows[0]
            why[f"claim {claim}, attempt {attempt}, {state}, last error {error}"] += 1
    ready = {name: ready_after(s, since, window.end) for name, s in sampler.samples.items()}
    # What held each node back after the new primary took writes: the checks false in
    # its samples from then on (how many samples each), and in its last one not ready.
    held_back: dict[str, Any] = {}
    for name, failing in sampler.failing.items():
        after = {t: f for t, f in failing.items() if since <= t <= window.end}
        if after:
            counts = Counter(check for f in after.values() for check in f)
            held_back[name] = {"samples": dict(counts), "last": after[max(after)]}
    gaps_after = [longest_gap(times, since, window.end) for times in desktops["arrivals"].values()]
    gaps_outage = [
        longest_gap(times, window.fault_at, window.end) for times in desktops["arrivals"].values()
    ]
    closes = [c for c in desktops["closes"] if window.start <= c[1] <= window.end]
    ready_values = list(ready.values())
    return {
        "fault": window.fault,
        "position": window.position,
        "old": window.old,
        "new": window.new,
        "writes_after_s": (
            None if window.writes_at is None else round(window.writes_at - window.fault_at, 1)
        ),
        "posts": len(mine),
        "acked": len(acked),
        "lost": len(lost),
        "pushes_expected": sum(len(phones_of[k % args.threads]) for k, *_ in acked),
        "pushes_missing": missing,
        "pushes_repeated": sum(n - 1 for n in repeated.values()),
        "repeated_why": dict(why),
        "posts_503": sum(1 for p in mine if p[4] == "503"),
        "posts_failed": sum(1 for p in mine if p[4] not in ("200", "503")),
        "slowest_s": round(max((p[3] for p in mine), default=0.0), 2),
        "ready_after_s": (
            None if None in ready_values else round(max(v or 0.0 for v in ready_values), 1)
        ),
        "ready_after_by_node": {n: None if v is None else round(v, 1) for n, v in ready.items()},
        "not_ready_checks": held_back,
        "desktop_gap_s": round(max(gaps_after, default=0.0), 1),
        "desktop_gap_outage_s": round(max(gaps_outage, default=0.0), 1),
        "desktop_closes": len(closes),
        "desktop_hints_repeated": sum(n - 1 for _, m, n in desktops["repeated"] if m in messages),
    }


# -- the run ---------------------------------------------------------------------------


@contextmanager
def processes(ctx: Any) -> Iterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.is_alive():
                proc.kill()
                proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default="kill,switchover,freeze")
    parser.add_argument("--positions", default="1,2,3", help="URL positions of the leader")
    parser.add_argument("--rate", type=float, default=20.0, help="POSTs a second")
    parser.add_argument("--desktops", type=int, default=20)
    parser.add_argument("--phones", type=int, default=50)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--freeze", type=float, default=45.0, help="seconds frozen")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    add_code_argument(parser)
    args = parser.parse_args()
    faults = args.faults.split(",")
    positions = [int(p) for p in args.positions.split(",")]
    began = time.monotonic()
    ensure_packages()
    found = versions()
    print(f"versions: {found}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="bothy-failover-"))
    os.chmod(workdir, 0o755)
    cluster = Cluster(workdir)
    nodes: list[BenchDaemon] = []
    ctx = multiprocessing.get_context("spawn")
    results: list[dict[str, Any]] = []
    aborted: str | None = None
    try:
        cluster.start()
        print(f"cluster whole in {time.monotonic() - began:.0f} s: leader {cluster.leader()}")
        leader = cluster.member(str(cluster.leader()))
        with psycopg.connect(leader.url(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE bothy LOGIN PASSWORD '{BOTHY_PASSWORD}'")
            admin.execute("CREATE DATABASE bothy OWNER bothy")
            admin.execute("CREATE TABLE bench_probe (at timestamptz, member text)")
        url = cluster.multi_host("bothy", BOTHY_PASSWORD, "bothy")
        with psycopg.connect(url) as conn:
            migrate(conn)
        nodes = [bothy_node(name, workdir, url, daemon_env(args)) for name in ("a", "b")]
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_serving_sync()
        seed(nodes[0].api, args)
        probe = WriteProbe(cluster.members)
        probe.start()
        sampler = ReadySampler(nodes)
        sampler.start()
        with processes(ctx) as started:
            desk_pipes = []
            for k, node in enumerate(nodes):
                assert node.gateway is not None
                users = [f"d{i}" for i in range(args.desktops) if i % len(nodes) == k]
                pipe, child = ctx.Pipe()
                proc = ctx.Process(target=desktop_process, args=(child, node.gateway, users))
                proc.start()
                started.append(proc)
                desk_pipes.append(pipe)
            ppipe, pchild = ctx.Pipe()
            producer = ctx.Process(
                target=producer_process,
                args=(pchild, [n.api for n in nodes], args.threads, args.rate),
            )
            producer.start()
            started.append(producer)
            print(
                f"load: {args.rate:g} POSTs/s, {args.desktops} desktops, {args.phones} phones,"
                f" {args.threads} threads",
                flush=True,
            )
            time.sleep(10.0)  # warm up
            windows: list[Window] = []
            try:
                for position in positions:
                    for fault in faults:
                        windows.append(
                            run_fault(cluster, probe, sampler, fault, position, args.freeze)
                        )
            except RuntimeError as exc:  # the cluster did not come back: report what ran
                aborted = str(exc)
                print(f"faults stopped: {aborted}", flush=True)
            ppipe.send("stop")
            posts: list[tuple[int, int, float, float, str]] = ppipe.recv()
            producer.join(60)
            print(f"load stopped: {len(posts)} POSTs; waiting for the jobs to drain", flush=True)
            drained = drain(url)
            counted = job_counters(nodes)
            desktops: dict[str, Any] = {"arrivals": {}, "closes": [], "repeated": []}
            for pipe in desk_pipes:
                pipe.send("stop")
                got = pipe.recv()
                desktops["arrivals"].update(got["arrivals"])
                desktops["closes"] += got["closes"]
                desktops["repeated"] += got["repeated"]
        sampler.stop()
        probe.stop()
        logged, jobs = primary_facts(url)
        sends, token_of = fake_sends(workdir)
        for window in windows:
            results.append(
                analyse(window, posts, logged, sends, jobs, token_of, sampler, desktops, args)
            )
        totals = {
            "posts": len(posts),
            "acked": sum(1 for p in posts if p[4] == "200"),
            "acked_lost": sum(1 for p in posts if p[4] == "200" and f"m{p[0]}" not in logged),
            "pushes": sum(sends.values()),
            "drained": drained,
            "aborted": aborted,
            **counted,
        }
    finally:
        for node in nodes:
            node.stop_sync()
        cluster.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print_table(results)
    print(
        f"totals: {totals}; patroni ttl {TTL} s, loop_wait {LOOP_WAIT} s, retry_timeout"
        f" {RETRY_TIMEOUT} s; machine {machine()}; took {time.monotonic() - began:.0f} s",
        flush=True,
    )
    worst = {
        "lost": sum(r["lost"] for r in results),
        "pushes_missing": sum(r["pushes_missing"] for r in results),
        "pushes_repeated_switchover": sum(
            r["pushes_repeated"] for r in results if r["fault"] == "switchover"
        ),
        "slowest_s": max((r["slowest_s"] for r in results), default=None),
        "ready_after_s": max(
            (r["ready_after_s"] if r["ready_after_s"] is not None else float("inf"))
            for r in results
        )
        if results
        else None,
        "desktop_gap_s": max((r["desktop_gap_s"] for r in results), default=None),
    }
    report("failover", **worst, totals=totals, faults=results, versions=found)


def job_counters(nodes: list[BenchDaemon]) -> dict[str, Any]:
    """Both nodes' results dropped by the fence (``lost_lease``) by job kind, jobs
    rescued at a lease's end by outcome, and gateway hints ended because their node
    was taken for gone (``node_gone``: a registry's sweep), over the whole run."""
    lost: Counter[str] = Counter()
    rescued: Counter[str] = Counter()
    node_gone = 0
    for node in nodes:
        with suppress(httpx.HTTPError):
            for name, value in node.metrics().items():
                if name.startswith("bothy_jobs_finished_total{") and 'result="lost_lease"' in name:
                    lost[name.split('kind="', 1)[1].split('"', 1)[0]] += int(value)
                elif name.startswith("bothy_jobs_rescued_total{"):
                    rescued[name.split('outcome="', 1)[1].split('"', 1)[0]] += int(value)
                elif name.startswith("bothy_jobs_finished_total{") and "node_gone" in name:
                    node_gone += int(value)
    return {
        "lost_lease_results": dict(lost),
        "rescued_jobs": dict(rescued),
        "node_gone_jobs": node_gone,
    }


def drain(url: str, timeout: float = 180.0) -> bool:
    """Wait until no push or gateway job is due or running on the primary."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM bothy.jobs WHERE state IN ('available', 'running')"
                " AND kind IN ('notify.push_send', 'notify.gateway_send')"
            ).fetchone()
            if row is not None and row[0] == 0:
                time.sleep(2.0)  # the last sends' records
                return True
        time.sleep(1.0)
    return False


def primary_facts(
    url: str,
) -> tuple[set[str], dict[tuple[str, str], list[tuple[str, int, int, str | None]]]]:
    """The message ids in the primary's log, and the push jobs by (registration, message)."""
    with psycopg.connect(url, autocommit=True) as conn:
        logged = {
            str(r[0])
            for r in conn.execute(
                "SELECT payload->>'message_id' FROM bothy.events WHERE type = 'message.created'"
            )
        }
        jobs: dict[tuple[str, str], list[tuple[str, int, int, str | None]]] = defaultdict(list)
        for reg, message, state, attempt, claim, error in conn.execute(
            "SELECT args->>'registration_id', args->>'message_id', state, attempt, claim,"
            " last_error FROM bothy.jobs WHERE kind = 'notify.push_send'"
        ):
            jobs[(str(reg), str(message))].append((state, attempt, claim, error))
    return logged, jobs


def fake_sends(workdir: Path) -> tuple[Counter[tuple[str, str]], dict[str, str]]:
    """Sends by (token, message) from both nodes' records, and registration -> token."""
    sends: Counter[tuple[str, str]] = Counter()
    token_of: dict[str, str] = {}
    for record in workdir.glob("*-pushes.jsonl"):
        for line in record.read_text().splitlines():
            send = json.loads(line)
            message = send["payload"].get("message_id")
            if message is not None:
                sends[(send["token"], message)] += 1
                token_of[send["registration_id"]] = send["token"]
    return sends, token_of


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        "fault       pos old->new  writes  acked  lost  pushes miss rep  503 fail"
        "  slowest  ready  gap(after/outage)  closes hints-rep"
    )
    for r in results:
        ready = "-" if r["ready_after_s"] is None else f"{r['ready_after_s']:.1f}"
        writes = "-" if r["writes_after_s"] is None else f"{r['writes_after_s']:.1f}"
        print(
            f"{r['fault']:<11} {r['position']:>3} {r['old']}->{r['new'] or '-':<4}"
            f" {writes:>6} {r['acked']:>6} {r['lost']:>5}"
            f" {r['pushes_expected']:>7} {r['pushes_missing']:>4} {r['pushes_repeated']:>3}"
            f" {r['posts_503']:>4} {r['posts_failed']:>4} {r['slowest_s']:>8.2f}"
            f" {ready:>6} {r['desktop_gap_s']:>8.1f}/{r['desktop_gap_outage_s']:<8.1f}"
            f" {r['desktop_closes']:>6} {r['desktop_hints_repeated']:>4}"
        )
        if r["repeated_why"]:
            print(f"            repeated: {r['repeated_why']}")
        if r["not_ready_checks"]:
            print(f"            not ready after the new primary: {r['not_ready_checks']}")


if __name__ == "__main__":
    main()
