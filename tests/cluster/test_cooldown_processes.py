"""The 4029 cooldown holds on every process and node (issue 30).

A device whose connection emptied its frame bucket is closed with 4029, and
refused with 4029 at identify until the bucket would have filled up again
(``sync.ops_burst / sync.ops_per_second``). The cooldown used to live in the
process that closed it, so the device got a fresh burst from any other process
(``server.processes``) or node. Here two daemons run as real processes on one
PostgreSQL (``cluster.mode = "multi"``): the device floods process A, then
identifies on process B before its cooldown ends and is refused there; once the
cooldown is over, B serves it.

Every wait polls a condition under an absolute timeout; nothing sleeps for a delay.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from testkit.ws import Closed
from tests.cluster.live import Cluster, live, node_config, until
from tests.faults.conftest import DaemonFactory
from tests.gateway.client import GatewayClient, identify
from tests.harness import device_token

pytestmark = pytest.mark.slow

BUCKET = {"ops_per_second": 1, "ops_burst": 4}
"""A bucket of 4 frames refilled at 1 a second: a cooldown of 4 s after 4029."""
COOLDOWN = BUCKET["ops_burst"] / BUCKET["ops_per_second"]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def test_a_device_closed_with_4029_is_refused_by_another_process_until_its_cooldown_ends(
    daemons: DaemonFactory,
    fault_db: str,
    tmp_path: Path,
    http: httpx.AsyncClient,
    nursery: trio.Nursery,
) -> None:
    a = await daemons("a", **node_config("all", sync=BUCKET))
    b = await daemons("b", **node_config("all", sync=BUCKET))
    c = Cluster(fault_db, tmp_path / "pushes.jsonl", http)
    assert await c.node_id(a) != await c.node_id(b)

    flooder = await live(nursery, a, "sam", "sam-desktop")
    with contextlib.suppress(Closed):  # closed while it sends
        for _ in range(20):
            await flooder.send("ping")

    async def cooling_on_the_row() -> bool:
        rows = await c.sql(
            "SELECT cooldown_until > now() FROM bothy.devices"
            " WHERE user_id = 'sam' AND device_id = 'sam-desktop'"
        )
        return rows == [(True,)]

    await until(cooling_on_the_row, "the cooldown on the device's row", COOLDOWN)
    await flooder.close()  # it does not wait for its 4029 (held back until the bucket is full)

    assert b.gateway is not None
    again = await GatewayClient.connect(nursery, b.gateway)
    await identify(again, device_token("sam", "sam-desktop", "macos"))

    assert await again.wait_closed(timeout=COOLDOWN + 10) == (4029, "too many frames")
    assert [f["op"] for f in again.frames] == ["hello"]  # no ready, no unread: no burst
    assert await c.metric(b, "bothy_gateway_rate_limited_total") == 1
    assert await c.metric(a, "bothy_gateway_rate_limited_total") == 1

    # Another device of the same person is not cooling: B serves it at once.
    await live(nursery, b, "sam", "sam-laptop")

    async def served_again() -> bool:
        assert b.gateway is not None
        later = await GatewayClient.connect(nursery, b.gateway)
        await identify(later, device_token("sam", "sam-desktop", "macos"))

        def served() -> bool:
            return any(f.get("op") == "catchup.complete" for f in later.frames)

        with trio.fail_after(COOLDOWN + 10):  # a refusal is held back until the cooldown ends
            while not (later.ended or served()):
                await trio.sleep(0.02)
        if not later.ended:
            await later.close()
        return served()

    await until(served_again, "the device served once its cooldown ended", 3 * COOLDOWN + 20)
