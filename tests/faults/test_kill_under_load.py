"""SIGKILL of the daemon at random points under load loses nothing.

100 message events/s through the outbox, phones registered with the fake
provider, linux desktops live on the gateway; the daemon is killed with SIGKILL
five times at random moments and restarted on its ports. At the end: every
event decided, every expected push recorded by the fake provider (duplicates
are allowed by at-least-once delivery and bounded by the sends in flight at
each kill), desktops that reconnect are live and get later hints, and the
daemon is ready.
"""

from __future__ import annotations

import random

import httpx
import pytest
import trio

from testkit.ws import Closed
from tests.faults.conftest import DaemonFactory
from tests.faults.world import (
    World,
    append,
    closing_count,
    count_pushes,
    produce,
    register_phone,
    wait_settled,
)
from tests.gateway.client import GatewayClient, identify
from tests.harness import device_token
from tests.procs import DaemonProcess

pytestmark = pytest.mark.slow

KILLS = 5
MESSAGES = 1000
RATE = 100.0
CONCURRENCY = 64
"""``jobs.concurrency``: a kill can repeat at most this many sends."""


class Desktop:
    """A linux desktop that stays connected: after its connection breaks it
    reconnects to the node's gateway until cancelled."""

    def __init__(self, person: str, node: DaemonProcess) -> None:
        self.person = person
        self.node = node
        self.client: GatewayClient | None = None
        self.lives = 0
        self.closes: list[int | None] = []

    async def run(self) -> None:
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    assert self.node.gateway is not None
                    client = await GatewayClient.connect(nursery, self.node.gateway)
                    await identify(
                        client, device_token(self.person, f"desk-{self.person}", "linux")
                    )
                    await client.wait_op("catchup.complete", timeout=30)
                    self.client = client
                    self.lives += 1
                    code = await client.wait_closed(timeout=3600)
                    self.closes.append(code[0])
                    nursery.cancel_scope.cancel()
            except* (
                OSError,
                AssertionError,
                trio.TooSlowError,
                trio.BrokenResourceError,
                Closed,
            ):
                pass  # the node is down or restarting: connect again
            self.client = None
            await trio.sleep(0.1)


async def test_sigkill_at_random_points_under_load_loses_nothing(
    daemons: DaemonFactory, fault_db: str
) -> None:
    rng = random.Random(8)
    world = World(
        people=[f"person-{i}" for i in range(4)], threads=[f"thread-{i}" for i in range(3)]
    )
    node = await daemons(
        "a",
        jobs={"lease": "2s", "concurrency": CONCURRENCY},
        notify={"poll_interval": "50ms", "coalesce_window": "0s"},
    )
    node.pin_ports()
    await append(fault_db, world.setup_events())
    async with httpx.AsyncClient(timeout=10) as http:
        tokens = set()
        for person in world.people:
            await register_phone(http, node.api, person)
            tokens.add(f"phone-token-{person}")
    desktops = [Desktop(p, node) for p in world.people[:2]]

    async with trio.open_nursery() as nursery:
        for desktop in desktops:
            nursery.start_soon(desktop.run)
        producer_done = trio.Event()

        async def producer() -> None:
            await produce(fault_db, world, rate=RATE, count=MESSAGES)
            producer_done.set()

        nursery.start_soon(producer)
        for _ in range(KILLS):
            await trio.sleep(rng.uniform(0.3, 2.0))
            await node.crash()
            await node.start()
        await producer_done.wait()
        appended, behind, busy = await wait_settled(fault_db)
        assert behind == 0 and busy == 0

        # Desktops that reconnected after the last restart are live and get a later hint.
        with trio.fail_after(30):
            while not all(d.client is not None for d in desktops):
                await trio.sleep(0.05)
        await append(fault_db, [world.message(MESSAGES)])
        for desktop in desktops:
            assert desktop.client is not None
            await desktop.client.wait_for(
                lambda f: (
                    f.get("type") == "notification.created"
                    and f["payload"].get("message_id") == f"msg-{MESSAGES}"
                ),
                timeout=30,
            )
        await wait_settled(fault_db)
        nursery.cancel_scope.cancel()

    expected = {(m, t) for m in world.sent for t in tokens}
    pushes = count_pushes(node.config_file.parent / "pushes.jsonl", expected)
    print(f"kills={KILLS} events={appended}")
    assert all(d.lives >= 2 for d in desktops), "a desktop never came back after a kill"
    assert node.starts == KILLS + 1
    await closing_count(
        fault_db, node, pushes, pid=node.pid, duplicates_at_most=KILLS * CONCURRENCY
    )
