"""A flood of gateway frames is closed with 4029, and a failing op closes with 1011.

Every client frame takes a token of its connection's bucket (``sync.ops_per_second``,
``sync.ops_burst``); past it the connection closes with 4029 ``too many frames``
(once the bucket would be full again) and ``bothy_gateway_rate_limited_total``
counts it, while other connections are served as before; the device is refused
with 4029 at identify until then. An op the database cannot serve closes the connection with
1011 ``server error``: a client is always told with a close code, never left
with a connection that just ends (1006).
"""

from __future__ import annotations

import contextlib
import json

import trio

from testkit.ws import Closed
from tests.gateway.client import (
    GatewayClient,
    connect_live,
    gateway_address,
    gateway_of,
    gauge,
    identify,
    wait_until,
)
from tests.gateway.world import start
from tests.harness import Launch, device_token


async def test_frames_past_the_bucket_close_with_4029_while_others_are_served(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"ops_per_second": 10, "ops_burst": 5})
    bystander = await connect_live(nursery, node, "alex", "alex-desktop")
    flooder = await connect_live(nursery, node, "sam", "sam-desktop")  # identify: one token

    with contextlib.suppress(Closed):  # closed while it sends
        for _ in range(20):
            await flooder.send_raw(json.dumps({"op": "ping"}))

    assert await flooder.wait_closed() == (4029, "too many frames")
    pongs = sum(f.get("op") == "pong" for f in flooder.frames)
    assert 4 <= pongs < 20  # the burst, less identify, and what came back meanwhile
    assert gauge(node.metrics, "bothy_gateway_rate_limited_total") == 1
    assert gauge(node.metrics, "bothy_gateway_closed_total", code="4029") == 1
    mark = len(bystander.frames)
    await bystander.send("ping")
    assert await bystander.wait_op("pong", after=mark) == {"op": "pong"}


async def test_a_device_that_reconnects_before_its_cooldown_is_refused_at_identify(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"ops_per_second": 1, "ops_burst": 3})
    limited = "bothy_gateway_rate_limited_total"
    flooder = await connect_live(nursery, node, "sam", "sam-desktop")
    with contextlib.suppress(Closed):
        for _ in range(10):
            await flooder.send("ping")
    await wait_until(lambda: gauge(node.metrics, limited) == 1)
    await flooder.close()  # it does not wait for its 4029 (held back: 3 s)

    again = await GatewayClient.connect(nursery, gateway_address(node))
    await identify(again, device_token("sam", "sam-desktop", "macos"))

    assert await again.wait_closed() == (4029, "too many frames")
    assert [f["op"] for f in again.frames] == ["hello"]
    assert gauge(node.metrics, limited) == 2
    assert await node.sql("SELECT count(*) FROM bothy.devices WHERE device_id = 'sam-desktop'") == [
        (1,)
    ]
    later = await connect_live(nursery, node, "sam", "sam-desktop")  # the cooldown is over
    mark = len(later.frames)
    await later.send("ping")
    await later.wait_op("pong", after=mark)


async def test_pings_within_the_rate_are_never_limited(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"ops_per_second": 50, "ops_burst": 2})
    client = await connect_live(nursery, node, "alex", "alex-desktop")

    for _ in range(10):  # 10 a second against 50 a second: the bucket never runs dry
        mark = len(client.frames)
        await client.send("ping")
        await client.wait_op("pong", after=mark)
        await trio.sleep(0.1)

    assert not client.ended
    assert gauge(node.metrics, "bothy_gateway_rate_limited_total") == 0


async def test_an_op_the_database_cannot_serve_closes_with_1011(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await connect_live(nursery, node, "alex", "alex-desktop")
    gateway_db = node.daemon.gateway_db
    assert gateway_db is not None and gateway_db is not node.db
    await gateway_db.close()  # every gateway query now fails: the store cannot be reached

    await client.send("focus", {"thread_ids": ["t1"]})

    assert await client.wait_closed() == (1011, "server error")
    assert gauge(node.metrics, "bothy_gateway_closed_total", code="1011") == 1
    assert gateway_of(node).hub.statistics().total == 0
