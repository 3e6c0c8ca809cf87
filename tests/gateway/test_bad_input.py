"""Bad input closes only the connection that sent it, with 4003 (or RFC 6455's code for
what breaks the WebSocket layer: 1007 for text that is not UTF-8, 1009 for a message over
the limit) and a constant reason, while another client keeps receiving hints (SPEC sections
8 and 14)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from tests.gateway.client import GatewayClient, connect_live, gateway_address, identify
from tests.gateway.world import message, start
from tests.harness import Launch, device_token


@dataclass(frozen=True)
class TextBytes:
    """A text frame that carries these bytes as they are (a client library would
    refuse to send text that is not UTF-8)."""

    payload: bytes


OVERSIZED = json.dumps({"op": "ping", "d": "x" * 2000})
"""Over ``sync.max_frame_bytes`` = 1024 of these tests."""

NOT_UTF8 = TextBytes(b'{"op":"ping","d":"\xff"}')
"""A text frame whose payload is not UTF-8 (sent as text, not as binary)."""

CASES: list[tuple[str, bool, str | bytes | TextBytes | dict[str, Any], int, str]] = [
    ("not json", True, "{not json", 4003, "malformed frame"),
    ("binary frame", True, b'{"op":"ping"}', 4003, "malformed frame"),
    ("not an object", True, '["ping"]', 4003, "malformed frame"),
    ("op not a string", True, {"op": 7}, 4003, "malformed frame"),
    ("unknown op", True, {"op": "subscribe", "d": {}}, 4003, "unknown op"),
    ("op before identify", False, {"op": "ping"}, 4003, "identify first"),
    (
        "focus before identify",
        False,
        {"op": "focus", "d": {"thread_ids": []}},
        4003,
        "identify first",
    ),
    (
        "second identify",
        True,
        {"op": "identify", "d": {"token": "x"}},
        4003,
        "already identified",
    ),
    ("oversized frame", True, OVERSIZED, 1009, "frame too large"),
    ("oversized before identify", False, OVERSIZED, 1009, "frame too large"),
    ("text not utf-8", True, NOT_UTF8, 1007, "invalid utf-8"),
    ("text not utf-8 before identify", False, NOT_UTF8, 1007, "invalid utf-8"),
    (
        "too many focus ids",
        True,
        {"op": "focus", "d": {"thread_ids": ["a", "b", "c", "d"]}},
        4003,
        "invalid focus",
    ),
    (
        "malformed focus id",
        True,
        {"op": "focus", "d": {"thread_ids": ["not an id!"]}},
        4003,
        "invalid focus",
    ),
    (
        "focus idle not a bool",
        True,
        {"op": "focus", "d": {"thread_ids": [], "idle": "no"}},
        4003,
        "invalid focus",
    ),
    (
        "negative read seq",
        True,
        {"op": "read", "d": {"thread_id": "t1", "seq": -1}},
        4003,
        "invalid read",
    ),
]


@pytest.mark.parametrize(
    ("identified", "frame", "code", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
async def test_a_bad_frame_closes_that_connection_with_its_code_while_others_get_hints(
    launch: Launch,
    nursery: trio.Nursery,
    identified: bool,
    frame: str | bytes | TextBytes | dict[str, Any],
    code: int,
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

    if isinstance(frame, TextBytes):
        await bad.send_text_bytes(frame.payload)
    else:
        await bad.send_raw(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    assert await bad.wait_closed() == (code, reason)
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
