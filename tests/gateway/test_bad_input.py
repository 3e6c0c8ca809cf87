"""Bad input closes only the connection that sent it, with 4003 and a constant reason,
while another client keeps receiving hints (SPEC sections 8 and 14)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.gateway.client import GatewayClient, connect_live, gateway_address, identify
from tests.gateway.world import message, start
from tests.harness import Launch, device_token

OVERSIZED = json.dumps({"op": "ping", "d": "x" * 2000})
"""Over ``sync.max_frame_bytes`` = 1024 of these tests."""

CASES: list[tuple[str, bool, str | bytes | dict[str, Any], str]] = [
    ("not json", True, "{not json", "malformed frame"),
    ("binary frame", True, b'{"op":"ping"}', "malformed frame"),
    ("not an object", True, '["ping"]', "malformed frame"),
    ("op not a string", True, {"op": 7}, "malformed frame"),
    ("unknown op", True, {"op": "subscribe", "d": {}}, "unknown op"),
    ("op before identify", False, {"op": "ping"}, "identify first"),
    ("focus before identify", False, {"op": "focus", "d": {"thread_ids": []}}, "identify first"),
    ("second identify", True, {"op": "identify", "d": {"token": "x"}}, "already identified"),
    ("oversized frame", True, OVERSIZED, "frame too large"),
    ("oversized before identify", False, OVERSIZED, "frame too large"),
    (
        "too many focus ids",
        True,
        {"op": "focus", "d": {"thread_ids": ["a", "b", "c", "d"]}},
        "invalid focus",
    ),
    (
        "malformed focus id",
        True,
        {"op": "focus", "d": {"thread_ids": ["not an id!"]}},
        "invalid focus",
    ),
    (
        "focus idle not a bool",
        True,
        {"op": "focus", "d": {"thread_ids": [], "idle": "no"}},
        "invalid focus",
    ),
    (
        "negative read seq",
        True,
        {"op": "read", "d": {"thread_id": "t1", "seq": -1}},
        "invalid read",
    ),
]


@pytest.mark.parametrize(
    ("identified", "frame", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_a_bad_frame_closes_that_connection_with_4003_while_others_get_hints(
    launch: Launch,
    nursery: trio.Nursery,
    identified: bool,
    frame: str | bytes | dict[str, Any],
    reason: str,
) -> None:
    node = await start(launch, sync={"max_frame_bytes": 1024, "max_focused_threads": 3})
    bystander = await connect_live(nursery, node, "alex", "alex-desktop")
    await bystander.focus(["t2"])
    if identified:
        bad = await connect_live(nursery, node, "sam", "sam-desktop")
    else:
        bad = await GatewayClient.connect(nursery, gateway_address(node))
        await bad.wait_op("hello")
    received = len(bad.frames)

    await bad.send_raw(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    assert await bad.wait_closed() == (4003, reason)
    assert len(bad.frames) == received
    assert await node.sql("SELECT * FROM bothy.read_states") == []
    await node.append(message(1))
    await node.settle()
    hint = await bystander.wait_for(lambda f: f.get("type") == "notification.created")
    assert hint["payload"]["message_id"] == "m1"


async def test_the_close_reason_never_echoes_the_input(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    client = await GatewayClient.connect(nursery, gateway_address(node))
    await identify(client, device_token("alex", "alex-desktop"))
    await client.wait_op("catchup.complete")

    await client.send("focus", {"thread_ids": ["alex-secret-thread!"]})

    code, reason = await client.wait_closed()
    assert code == 4003 and reason is not None and "secret" not in reason
