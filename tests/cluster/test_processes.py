"""Several nodes on one PostgreSQL, as real processes on real sockets
(``cluster.mode = "multi"``): for every person the cluster behaves like one ``all``
node: the right device is told, at the right time, once.

Each daemon is ``python -m bothy_notify.cli run`` on the module's embedded
PostgreSQL (a fresh database per test); pushes are counted from the fake
provider's ``push.fake.record_file`` that every node appends to; desktops are
gateway clients speaking SPEC section 8. Real processes share no fake clock, so
the delays of these configurations are short (``tests.cluster.live.CLUSTER``)
and every wait polls a condition under an absolute timeout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trustme

from testkit.fakes.webhook import SIGNING_KEY, WebhookReceiver
from testkit.ws import Closed
from tests.cluster.live import (
    DELAY,
    GATEWAY_SEND,
    PUSH_SEND,
    WORLD,
    Cluster,
    hints,
    live,
    message,
    node_config,
    until,
)
from tests.faults.conftest import DaemonFactory
from tests.gateway.client import GatewayClient, identify
from tests.harness import device_token, ev
from tests.procs import DaemonProcess

pytestmark = pytest.mark.slow

ROUND = 2.0
"""Seconds a round may take on a loaded machine, from an append to its decision: the
slack of "within ``cluster.node_timeout`` plus one round"."""


async def start(
    daemons: DaemonFactory, *nodes: tuple[str, str], **extra: dict[str, Any]
) -> list[DaemonProcess]:
    """Start ``(name, role)`` nodes at once (``extra`` sections merged into each);
    returns them in order."""
    started: dict[str, DaemonProcess] = {}

    async def one(name: str, role: str) -> None:
        started[name] = await daemons(name, **node_config(role, **extra))

    async with trio.open_nursery() as nursery:
        for name, role in nodes:
            nursery.start_soon(one, name, role)
    return [started[name] for name, _ in nodes]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def test_two_api_nodes_and_a_worker_tell_the_right_device_at_the_right_time_once(
    daemons: DaemonFactory, fault_db: str, tmp_path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    a, b, worker = await start(daemons, ("a", "api"), ("b", "api"), ("w", "worker"))
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    await c.append(a, *WORLD)
    await c.register(b, "alex", "alex-phone", "alex-phone-token")
    await c.settled()
    desktop = await live(nursery, a, "alex", "alex-desktop", "macos")

    # Focusing the thread on node A: nothing anywhere, though the worker decides.
    await desktop.focus(["t1"])
    await c.append(b, message(1))
    await c.settled()
    assert await c.jobs(GATEWAY_SEND, "alex") == []
    assert await c.jobs(PUSH_SEND, "alex") == []
    assert await c.metric(worker, "bothy_push_skipped_total", reason="active_in_thread") == 1
    assert hints(desktop) == [] and c.pushes("alex-phone-token") == []

    # Focusing another thread: the hint from A, the phone waits and the read through
    # B's HTTP API drops its push.
    await desktop.focus(["t2"])
    await c.append(b, message(2))
    await until(lambda: _has(desktop, "m2"), "the desktop's hint for m2")
    (gateway_job,) = await c.jobs(GATEWAY_SEND, "alex")
    assert gateway_job["node_id"] == await c.node_id(a)
    (push_job,) = await c.jobs(PUSH_SEND, "alex")
    assert push_job["args"]["release_seq"] == 2
    assert (push_job["scheduled_at"] - push_job["created_at"]).total_seconds() == DELAY
    await c.read(b, "alex", "alex-desktop", "t1", 2)
    await until(
        lambda: _state(c, push_job["id"], "completed"), "the delayed push to end", DELAY + 15
    )
    assert c.pushes("alex-phone-token") == []
    assert await c.metric(worker, "bothy_push_skipped_total", reason="read") == 1

    # A laptop of the same person on B and the desktop on A: each told once.
    laptop = await live(nursery, b, "alex", "alex-laptop", "windows")
    await c.append(a, message(3))
    await until(lambda: _has(laptop, "m3"), "the laptop's hint for m3")
    await until(lambda: _has(desktop, "m3"), "the desktop's hint for m3")
    await c.settled()
    assert len(hints(desktop, "m3")) == len(hints(laptop, "m3")) == 1
    assert hints(laptop, "m3")[0]["nid"] == hints(desktop, "m3")[0]["nid"]
    for node in (a, b):
        assert await c.metric(
            node, "bothy_jobs_finished_total", kind=GATEWAY_SEND, result="published"
        ) == (2 if node is a else 1)

    # The laptop moves to A while its connection on B is still open: as on one node,
    # the older connection closes with 4017, and the device is told once.
    moved = await live(nursery, a, "alex", "alex-laptop", "windows")
    assert await laptop.wait_closed() == (4017, "replaced by a newer connection")
    assert not moved.ended
    await c.append(b, message(4))
    await until(lambda: _has(moved, "m4"), "the moved laptop's hint for m4")
    await until(lambda: _has(desktop, "m4"), "the desktop's hint for m4")
    await c.settled()
    assert len(hints(moved, "m4")) == len(hints(desktop, "m4")) == 1
    assert hints(laptop, "m4") == []


async def _has(client, message_id: str) -> bool:
    return bool(hints(client, message_id))


async def _state(c: Cluster, job_id: int, state: str) -> bool:
    rows = await c.sql("SELECT state FROM bothy.jobs WHERE id = %s", (job_id,))
    return rows == [(state,)]


async def test_two_all_nodes_deliver_every_hint_exactly_once_from_the_holding_node(
    daemons: DaemonFactory, fault_db: str, tmp_path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    a, b = await start(daemons, ("a", "all"), ("b", "all"))
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    people = [f"p{i}" for i in range(4)]
    await c.append(
        a,
        ev("user.upserted", user_id="robin", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        *(ev("user.upserted", user_id=p, kind="human", active=True) for p in people),
        *(ev("member.added", user_id=p, scope_id="s1") for p in people),
        *(ev("thread.followed", user_id=p, thread_id="t1", level="all") for p in people),
    )
    await c.settled()
    on_a = [await live(nursery, a, p, f"{p}-desktop") for p in people[:2]]
    on_b = [await live(nursery, b, p, f"{p}-desktop") for p in people[2:]]
    on_b.append(await live(nursery, b, "p0", "p0-laptop", "linux"))
    total = 200

    for first in range(1, total + 1, 20):
        node = a if first % 40 == 1 else b
        await c.append(node, *(message(seq) for seq in range(first, first + 20)))
    for client in on_a + on_b:
        await until(partial(_count, client, total), "every hint on every desktop")
    await c.settled()

    expected = {f"m{seq}" for seq in range(1, total + 1)}
    for client in on_a + on_b:
        received = [h["message_id"] for h in hints(client)]
        assert len(received) == total and set(received) == expected  # each exactly once
    node_a, node_b = await c.node_id(a), await c.node_id(b)
    targets = await c.sql(
        "SELECT args->>'user_id', node_id::text, count(*) FROM bothy.jobs WHERE kind = %s"
        " GROUP BY 1, 2 ORDER BY 1, 2",
        (GATEWAY_SEND,),
    )
    holders = [("p0", node_a), ("p0", node_b), ("p1", node_a), ("p2", node_b), ("p3", node_b)]
    assert targets == sorted((p, n, total) for p, n in holders)
    published = [
        await c.metric(node, "bothy_jobs_finished_total", kind=GATEWAY_SEND, result="published")
        for node in (a, b)
    ]
    assert published == [2 * total, 3 * total]  # never published where nobody got it
    for node in (a, b):
        assert await c.metric(node, "bothy_push_skipped_total", reason="no_connection") == 0


async def _count(client, total: int) -> bool:
    return len(hints(client)) >= total


async def test_a_killed_node_loses_nothing_and_its_desktop_stops_counting_after_node_timeout(
    daemons: DaemonFactory, fault_db: str, tmp_path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    hooks = WebhookReceiver(ca=ca, hosts=("127.0.0.1",), stall_paths={"/sam"})
    await nursery.start(hooks.serve)
    delay, timeout = 5.0, 4.0  # time to start the worker before anything is due
    extra = {
        "notify": {"mobile_delay_when_desktop_active": f"{delay:g}s"},
        "cluster": {"node_timeout": f"{timeout:g}s"},
        "push": {
            "webhook": {
                "allowed_domains": ["127.0.0.1"],
                "allow_private_addresses": True,
                "ca_file": str(ca_file),
            }
        },
    }
    a = await daemons("a", **node_config("all", **extra))
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    await c.append(a, *WORLD)
    await c.register(a, "alex", "alex-phone", "alex-phone-token")
    response = await http.post(
        f"{a.api_url}/v1/registrations",
        json={
            "provider": "webhook",
            "token": hooks.url("/sam", "127.0.0.1"),
            "signing_key": SIGNING_KEY,
        },
        headers={"authorization": f"Bearer {device_token('sam', 'sam-server', 'linux')}"},
    )
    assert response.status_code == 201, response.text
    await c.settled()
    desktop = await live(nursery, a, "alex", "alex-desktop", "macos")
    await desktop.focus(["t2"])  # active, elsewhere: alex's phone waits

    await c.append(a, message(1))
    await until(partial(_has, desktop, "m1"), "the desktop's hint")
    await until(_true_when(lambda: hooks.stalled == 1), "node A to be stuck sending to sam")
    (delayed,) = await c.jobs(PUSH_SEND, "alex")
    assert delayed["args"]["release_seq"] == 1 and delayed["state"] == "available"
    (claimed,) = await c.jobs(PUSH_SEND, "sam")
    assert claimed["state"] == "running"
    node_a = await c.node_id(a)
    w = await daemons("w", **node_config("worker", **extra))
    hooks.stall_paths.clear()

    killed_at = trio.current_time()
    await a.crash()
    # Decided while A still counts (until cluster.node_timeout): a gateway hint for
    # A's desktop and a delayed push. A is gone before the hint is sent: it ends as
    # node_gone, and nothing else changes: the push still goes out after its delay.
    await c.outbox(message(2))
    await until(partial(_job_count, c, GATEWAY_SEND, "alex", 2), "m2's gateway hint")
    gateway_m2 = (await c.jobs(GATEWAY_SEND, "alex"))[1]
    assert gateway_m2["node_id"] == node_a

    # A new message every round until one is pushed at once: the first is appended
    # within cluster.node_timeout (plus a round) of the kill, and every one before it
    # was delayed (A's desktop still counted) with a hint for A that ends node_gone.
    seq = 3
    while True:
        appended_at = trio.current_time()
        await c.outbox(message(seq))
        await until(partial(_decided, c, f"m{seq}"), f"m{seq} to be decided")
        (push,) = [
            j for j in await c.jobs(PUSH_SEND, "alex") if j["args"]["message_id"] == f"m{seq}"
        ]
        if push["scheduled_at"] == push["created_at"]:
            break
        assert push["args"]["release_seq"] == seq
        seq += 1
    assert appended_at - killed_at <= timeout + ROUND
    assert push["args"]["release_seq"] == 0
    assert seq > 3  # A's desktop counted for a while after the kill
    await until(partial(_pushed, c, "alex-phone-token", f"m{seq}"), "the immediate push")
    gateway = await c.jobs(GATEWAY_SEND, "alex")
    assert [j["args"]["message_id"] for j in gateway] == [f"m{i}" for i in range(1, seq)]
    for job in gateway[1:]:
        await until(partial(_state, c, job["id"], "completed"), "node_gone", timeout + 10)
    gateway = await c.jobs(GATEWAY_SEND, "alex")
    assert {j["node_id"] for j in gateway} == {node_a}
    assert [j["last_error"] for j in gateway[1:]] == ["node_gone"] * (seq - 2)
    assert await c.metric(w, "bothy_push_skipped_total", reason="node_gone") == seq - 2

    # The pushes delayed before and after the kill are sent (by the worker), once each.
    await until(
        partial(_pushed, c, "alex-phone-token", f"m{seq - 1}"), "the delayed pushes", delay + 20
    )
    expected = [f"m{i}" for i in range(1, seq + 1)]
    assert sorted(p["message_id"] for p in c.pushes("alex-phone-token")) == sorted(expected)
    # A's claimed send ran again on the worker after its lease.
    await until(partial(_state, c, claimed["id"], "completed"), "A's claimed job to run again")

    def sam_got_everything() -> bool:
        got = sorted(d.body["message_id"] for d in hooks.deliveries if d.verified)
        return got == sorted(expected)

    await until(_true_when(sam_got_everything), "every message at sam's webhook, once")
    ((attempts,),) = await c.sql("SELECT attempt FROM bothy.jobs WHERE id = %s", (claimed["id"],))
    assert attempts == 2
    # The worker's registry no longer shows A, and A's presence rows are swept.
    await until(partial(_without, c, w, node_a), "the worker to take A for gone", timeout + 10)
    assert await c.sql("SELECT 1 FROM bothy.presence WHERE node_id = %s", (node_a,)) == []


async def _decided(c: Cluster, message_id: str) -> bool:
    rows = await c.sql(
        "SELECT 1 FROM bothy.jobs WHERE kind = %s AND args->>'message_id' = %s",
        (PUSH_SEND, message_id),
    )
    return bool(rows)


async def _job_count(c: Cluster, kind: str, user: str, count: int) -> bool:
    return len(await c.jobs(kind, user)) >= count


def _true_when(check):
    async def predicate() -> bool:
        return bool(check())

    return predicate


async def _pushed(c: Cluster, token: str, message_id: str) -> bool:
    return any(p.get("message_id") == message_id for p in c.pushes(token))


async def _without(c: Cluster, node: DaemonProcess, gone: str) -> bool:
    return gone not in {n["node_id"] for n in (await c.readyz(node))["cluster"]["nodes"]}


class Load:
    """Messages in t1 through the outbox at a steady rate; ``sent`` counts them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.sent = 0

    async def run(self, rate: float) -> None:
        start_at = trio.current_time()
        while True:
            # Shielded: an append is never left half done when the load stops.
            with trio.CancelScope(shield=True):
                await self.cluster.outbox(message(self.sent + 1))
                self.sent += 1
            await trio.sleep_until(start_at + self.sent / rate)

    async def more(self, count: int) -> None:
        """Wait until ``count`` more messages went in."""
        mark = self.sent
        await until(_true_when(lambda: self.sent >= mark + count), "more load")


CONNECT_TIMEOUT = 5.0
"""Seconds a desktop's connection attempt (TCP and WebSocket upgrade) may take."""


class Desktop:
    """A desktop that reconnects whenever its connection ends: to its own node while
    that one serves, else to the other gateway node. After every ``catchup.complete``
    it sends its focus again; ``live`` counts the connections that got that far."""

    def __init__(self, user: str, nodes: list[DaemonProcess]) -> None:
        self.user, self.nodes = user, nodes
        self.client: GatewayClient | None = None
        self.live = 0
        self.attempts: list[str] = []
        """What became of each connection (close codes, failed attempts): a failure says."""

    def __repr__(self) -> str:
        ended = None if self.client is None else self.client.ended
        return f"Desktop(live={self.live}, ended={ended}, last={self.attempts[-8:]})"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            async with trio.open_nursery() as nursery:
                client = await self._connect(nursery)
                if await self._caught_up(client):
                    self.client, self.live = client, self.live + 1
                    await client.focus(["t2"])  # active elsewhere: phones wait
                    if not started:
                        started = True
                        task_status.started()
                    while not client.ended:
                        await trio.sleep(0.02)
                self.attempts.append(f"closed {client.close_code}")
                nursery.cancel_scope.cancel()

    async def _connect(self, nursery: trio.Nursery) -> GatewayClient:
        while True:
            for node in self.nodes:
                if not node.alive() or node.gateway is None:
                    continue
                # Bounded, as a real client's connect timeout is: a node in its last
                # moments may still take the connection into its listen queue and then
                # reset it before the upgrade's answer.
                with trio.move_on_after(CONNECT_TIMEOUT) as attempt:
                    try:
                        client = await GatewayClient.connect(nursery, node.gateway)
                    except (OSError, trio.BrokenResourceError, Closed):
                        # Refused, or reset by a node closing its listener (the reset
                        # reaches the upgrade's send as a broken stream).
                        self.attempts.append("connect failed")
                        continue
                if attempt.cancelled_caught:
                    self.attempts.append("connect timed out")
                    continue
                try:
                    await identify(client, device_token(self.user, f"{self.user}-desktop", "macos"))
                except Closed:
                    continue  # a stopping node said hello, then closed with 1001
                except AssertionError:
                    # A node in its last moments of shutdown took the connection and
                    # ended it before `hello` (no close frame once it stops serving):
                    # a failed attempt, as a real client sees it. Anything else fails.
                    if not client.ended:
                        raise
                    continue
                return client
            await trio.sleep(0.05)

    @staticmethod
    async def _caught_up(client: GatewayClient) -> bool:
        """Whether ``catchup.complete`` came (a node shutting down closes at once)."""
        with trio.fail_after(20):
            while not any(f.get("op") == "catchup.complete" for f in client.frames):
                if client.ended:
                    return False
                await trio.sleep(0.01)
        return True


# Six daemon starts, each waited on in turn (three at once, then three restarts): a
# start imports the whole daemon, which alone takes many seconds on a loaded 2-core
# machine (up to its own 60 s bound), so the session's 60 s guard failed this test by
# time, never by a hang (bench/results/2026-12-05-rolling-restart.md). Every wait
# inside keeps its own bound; pytest-timeout's stays above the deadline.
@pytest.mark.deadline(240)
@pytest.mark.timeout(300)
async def test_a_rolling_restart_under_steady_load_loses_and_duplicates_nothing(
    daemons: DaemonFactory, fault_db: str, tmp_path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    # Every stop here is graceful, so no lease needs to run out: a lease longer than
    # the cluster tests' 2 s keeps a node starved of CPU for seconds on a loaded
    # machine (seen: a freshly started worker recording its pushes seconds after it
    # sent them) from losing its jobs to a rescue and a second send, which is the
    # lease doing its job, not what this test is about.
    a, b, w = await start(
        daemons, ("a", "api"), ("b", "api"), ("w", "worker"), jobs={"lease": "15s"}
    )
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    await c.append(a, *WORLD)
    await c.register(a, "alex", "alex-phone", "alex-phone-token")
    await c.register(b, "sam", "sam-phone", "sam-phone-token")
    await c.settled()
    alex, sam = Desktop("alex", [a, b]), Desktop("sam", [b, a])
    await nursery.start(alex.run)
    await nursery.start(sam.run)

    load = Load(c)
    async with trio.open_nursery() as producer:
        producer.start_soon(load.run, 50.0)
        for node in (a, b, w):
            await load.more(25)
            node.pin_ports()
            assert await node.stop() == 0
            await node.start()
        await load.more(25)
        producer.cancel_scope.cancel()

    # Every desktop reconnected at least once, is live again and still gets hints (a
    # reconnection may still be catching up when the last node is back: wait for it).
    async def both_back() -> bool:
        return all(d.live >= 2 and d.client is not None and not d.client.ended for d in (alex, sam))

    # A restarted node serves in seconds; the bound leaves room for a loaded CI machine.
    try:
        await until(both_back, "both desktops live again after the restarts", 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {alex!r}, {sam!r}") from None
    sent = load.sent + 1
    await c.outbox(message(sent))
    for desktop in (alex, sam):
        assert desktop.client is not None
        await until(partial(_has, desktop.client, f"m{sent}"), "a hint after the restarts")
    await c.settled(timeout=30)
    await until(
        lambda: _pushed(c, "sam-phone-token", f"m{sent}"), "the last delayed push", DELAY + 20
    )
    # Every other push was due by then, but another node may still be sending one
    # (seen under load: alex's last two still running): wait until none runs or is due.
    await c.settled(timeout=30)

    expected = Counter(f"m{seq}" for seq in range(1, sent + 1))
    for token in ("alex-phone-token", "sam-phone-token"):
        # Each message: exactly one push per phone (delayed while its desktop was live,
        # immediate while it reconnected); none lost, none twice.
        assert Counter(p["message_id"] for p in c.pushes(token)) == expected
    assert sent >= 100


async def test_the_round_holder_is_killed_and_the_next_takes_over_on_its_first_try(
    daemons: DaemonFactory, fault_db: str, tmp_path, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    a, b, w1, w2 = await start(
        daemons, ("a", "api"), ("b", "api"), ("w1", "worker"), ("w2", "worker")
    )
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    await c.append(a, *WORLD)
    await c.settled()
    alex = await live(nursery, a, "alex", "alex-desktop", "macos")
    sam = await live(nursery, b, "sam", "sam-desktop", "windows")
    await c.append(b, message(1))
    for client in (alex, sam):
        await until(partial(_has, client, "m1"), "hints before the kill")
    holder, standby = (w1, w2) if await c.metric(w1, "bothy_consumer_holder") == 1 else (w2, w1)
    assert await c.metric(standby, "bothy_consumer_holder") == 0
    tries_before = await c.metric(standby, "bothy_consumer_lock_attempts_total")

    await holder.crash()
    tries_at_kill = await c.metric(standby, "bothy_consumer_lock_attempts_total")
    await until(
        lambda: _metric_is(c, standby, "bothy_consumer_holder", 1), "the standby to take over"
    )

    # Its first try after the holder's connection ended took the lock (a try that
    # raced with the kill itself may have failed before it).
    taken_at = await c.metric(standby, "bothy_consumer_lock_attempts_total")
    assert taken_at - tries_at_kill <= 1 and taken_at - tries_before <= 2
    await c.append(a, message(2))
    for client in (alex, sam):
        await until(partial(_has, client, "m2"), "hints after the take-over")
    assert not alex.ended and not sam.ended  # the gateway nodes kept serving


async def _metric_is(c: Cluster, node: DaemonProcess, name: str, value: float) -> bool:
    return await c.metric(node, name) == value
