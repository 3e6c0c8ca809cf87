"""Hostile gateway input gets a constant close, 4003 for a frame (1007 for text that is
not UTF-8) and 4001 for a token, never 1006 and never an effect; a live client of another
person keeps working throughout (SPEC sections 8 and 14)."""

from __future__ import annotations

import json
from typing import Any

import trio

from testkit.ws import OPCODE_BINARY, client_frame
from tests.gateway.client import GatewayClient, connect_live, gateway_address
from tests.gateway.world import message, start
from tests.harness import Launch, Node, device_token
from tests.hostile.tokens import malformed_device_tokens

MALFORMED = "malformed frame"
INVALID_TEXT = "invalid utf-8"
"""RFC 6455's 1007: a text frame that is not UTF-8 never reaches the protocol."""
DEEP = '{"op":"ping","d":' + "[" * 20_000 + "]" * 20_000 + "}"
"""Far deeper than Python's parser goes, within ``sync.max_frame_bytes``."""


def frame(**members: Any) -> bytes:
    return json.dumps(members).encode()


def ops_with_every_wrong_type() -> list[tuple[str, bytes, str]]:
    """(name, frame, reason) of a live connection's ops with a member of the wrong type."""
    odd: list[Any] = [None, 1, 1.5, True, "x", [], {}]
    cases: list[tuple[str, bytes, str]] = []
    for value in odd:
        if not isinstance(value, str):
            cases.append((f"op {value!r}", frame(op=value), MALFORMED))
        if value is not None and value != {}:
            cases.append((f"ping d {value!r}", frame(op="ping", d=value), MALFORMED))
        if not isinstance(value, dict):
            for op in ("focus", "read", "reauth"):
                cases.append((f"{op} d {value!r}", frame(op=op, d=value), MALFORMED))
        if not isinstance(value, str):
            cases.append(
                (f"reauth token {value!r}", frame(op="reauth", d={"token": value}), MALFORMED)
            )
        if not isinstance(value, list):
            cases.append(
                (
                    f"focus ids {value!r}",
                    frame(op="focus", d={"thread_ids": value}),
                    "invalid focus",
                )
            )
        if not isinstance(value, str):  # "x" is a valid ID
            cases.append(
                (
                    f"focus id {value!r}",
                    frame(op="focus", d={"thread_ids": [value]}),
                    "invalid focus",
                )
            )
        if not isinstance(value, bool):
            cases.append(
                (
                    f"focus idle {value!r}",
                    frame(op="focus", d={"thread_ids": [], "idle": value}),
                    "invalid focus",
                )
            )
        if not isinstance(value, str):
            cases.append(
                (
                    f"read thread {value!r}",
                    frame(op="read", d={"thread_id": value, "seq": 1}),
                    "invalid read",
                )
            )
        if type(value) is not int:
            cases.append(
                (
                    f"read seq {value!r}",
                    frame(op="read", d={"thread_id": "t1", "seq": value}),
                    "invalid read",
                )
            )
    return cases


LIVE_CASES: list[tuple[str, bytes, str]] = [
    ("empty text", b"", MALFORMED),
    ("not JSON", b"{not json", MALFORMED),
    ("a JSON string", b'"ping"', MALFORMED),
    ("a JSON list", b'["ping"]', MALFORMED),
    ("JSON null", b"null", MALFORMED),
    ("a member that does not belong", frame(op="ping", x=1), MALFORMED),
    ("op missing", frame(d={}), MALFORMED),
    ("op empty", frame(op=""), "unknown op"),
    ("op unknown", frame(op="subscribe", d={}), "unknown op"),
    ("op named twice", b'{"op":"ping","op":"ping"}', MALFORMED),
    ("d named twice", b'{"op":"ping","d":{},"d":{}}', MALFORMED),
    (
        "member named twice inside d",
        b'{"op":"read","d":{"thread_id":"t1","seq":1,"seq":2}}',
        MALFORMED,
    ),
    ("NaN", b'{"op":"read","d":{"thread_id":"t1","seq":NaN}}', MALFORMED),
    ("Infinity", b'{"op":"read","d":{"thread_id":"t1","seq":-Infinity}}', MALFORMED),
    ("a number beyond a double", b'{"op":"read","d":{"thread_id":"t1","seq":1e999}}', MALFORMED),
    (
        "a 5000-digit number",
        b'{"op":"read","d":{"thread_id":"t1","seq":' + b"9" * 5000 + b"}}",
        MALFORMED,
    ),
    ("seq past 2^53 - 1", frame(op="read", d={"thread_id": "t1", "seq": 2**53}), "invalid read"),
    ("seq negative", frame(op="read", d={"thread_id": "t1", "seq": -1}), "invalid read"),
    ("nested too deep", DEEP.encode(), MALFORMED),
    ("invalid UTF-8", b'{"op":"ping","d":"\xff\xfe"}', INVALID_TEXT),
    ("a surrogate in UTF-8", b'{"op":"ping","d":"\xed\xa0\x80"}', INVALID_TEXT),
    ("an overlong encoding", b'{"op":"ping","d":"\xc0\xaf"}', INVALID_TEXT),
    ("truncated UTF-8", b'{"op":"ping","d":"\xe2\x82"}', INVALID_TEXT),
    ("identify again", frame(op="identify", d={"token": "x"}), "already identified"),
    *ops_with_every_wrong_type(),
]

ODD_D: tuple[Any, ...] = (None, 1, "x", [], {})
ODD_TOKENS: tuple[Any, ...] = (None, 1, 1.5, True, [], {})

UNIDENTIFIED_CASES: list[tuple[str, bytes, str]] = [
    ("not JSON", b"{not json", MALFORMED),
    ("nested too deep", DEEP.encode(), MALFORMED),
    ("invalid UTF-8", b'{"op":"identify","d":{"token":"\xff"}}', INVALID_TEXT),
    ("token named twice", b'{"op":"identify","d":{"token":"a","token":"b"}}', MALFORMED),
    ("identify without d", frame(op="identify"), MALFORMED),
    *[(f"identify d {v!r}", frame(op="identify", d=v), MALFORMED) for v in ODD_D],
    *[
        (f"identify token {v!r}", frame(op="identify", d={"token": v}), MALFORMED)
        for v in ODD_TOKENS
    ],
    ("identify with another member", frame(op="identify", d={"token": "x", "y": 1}), MALFORMED),
    ("ping first", frame(op="ping"), "identify first"),
    ("reauth first", frame(op="reauth", d={"token": "x"}), "identify first"),
    ("read first", frame(op="read", d={"thread_id": "t1", "seq": 1}), "identify first"),
]


async def bystander(nursery: trio.Nursery, node: Node) -> GatewayClient:
    """Alex, live and focused elsewhere, so a message in t1 reaches this desktop."""
    client = await connect_live(nursery, node, "alex", "alex-desktop")
    await client.focus(["t2"])
    return client


async def bystander_still_works(node: Node, client: GatewayClient, seq: int) -> None:
    mark = len(client.frames)
    await client.send("ping")
    await client.wait_op("pong", after=mark)
    await node.append(message(seq))
    await node.settle()
    hint = await client.wait_for(lambda f: f.get("type") == "notification.created", after=mark)
    assert hint["payload"]["message_id"] == f"m{seq}"


def code_of(reason: str) -> int:
    return 1007 if reason == INVALID_TEXT else 4003


async def closed_by(raw: GatewayClient) -> tuple[int | None, str | None]:
    with trio.fail_after(10):
        await raw.read_until(lambda f: False)
    return raw.close_code, raw.close_reason


async def test_every_malformed_frame_of_a_live_connection_closes_it_with_its_code(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    alex = await bystander(nursery, node)
    token = device_token("sam", "sam-desktop", "macos")
    for name, payload, reason in LIVE_CASES:
        raw = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
        try:
            await raw.send("identify", {"token": token})
            assert await raw.read_until(lambda f: f.get("op") == "catchup.complete")
            await raw.stream.send_all(client_frame(payload))
            assert await closed_by(raw) == (code_of(reason), reason), name
        finally:
            await raw.aclose()
    assert await node.sql("SELECT count(*) FROM bothy.read_states") == [(0,)]
    await bystander_still_works(node, alex, 1)


async def test_every_malformed_frame_before_identify_closes_with_its_code(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    alex = await bystander(nursery, node)
    for name, payload, reason in UNIDENTIFIED_CASES:
        raw = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
        try:
            assert await raw.wait_hello()
            await raw.stream.send_all(client_frame(payload))
            assert await closed_by(raw) == (code_of(reason), reason), name
        finally:
            await raw.aclose()
    await bystander_still_works(node, alex, 1)


async def test_a_binary_frame_closes_with_4003_in_every_phase(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    alex = await bystander(nursery, node)
    for identified in (False, True):
        raw = await GatewayClient.open(gateway_address(node), receive_buffer=4096)
        try:
            if identified:
                token = device_token("sam", "sam-desktop", "macos")
                await raw.send("identify", {"token": token})
                assert await raw.read_until(lambda f: f.get("op") == "catchup.complete")
            await raw.stream.send_all(client_frame(b'{"op":"ping"}', opcode=OPCODE_BINARY))
            assert await closed_by(raw) == (4003, MALFORMED)
        finally:
            await raw.aclose()
    await bystander_still_works(node, alex, 1)


async def test_every_malformed_token_closes_identify_with_4001(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch)
    alex = await bystander(nursery, node)
    for name, token in malformed_device_tokens():
        client = await GatewayClient.connect(nursery, gateway_address(node))
        await client.wait_op("hello")
        # json.dumps writes a lone surrogate as the escape \ud800: valid JSON text
        # whose string the token verifier must still cope with.
        await client.send_raw(json.dumps({"op": "identify", "d": {"token": token}}))
        assert await client.wait_closed() == (4001, "authentication failed"), name
        assert [f["op"] for f in client.frames] == ["hello"], name
    assert await node.sql("SELECT device_id FROM bothy.devices ORDER BY 1") == [
        ("alex-desktop",),
        ("alex-phone",),
    ]
    await bystander_still_works(node, alex, 1)


async def test_an_odd_upgrade_ends_that_connection_only(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start(launch, sync={"identify_timeout": "500ms", "write_timeout": "500ms"})
    alex = await bystander(nursery, node)
    host, _, port = gateway_address(node).rpartition(":")
    garbage = {
        "not HTTP": b"\x00\xff\xfe\x16\x03\x01 hello\r\n\r\n",
        "no upgrade": b"GET /v1/gateway HTTP/1.1\r\nHost: x\r\n\r\n",
        "a bad key": (
            b"GET /v1/gateway HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: \xff\r\n\r\n"
        ),
        "a NUL in a header": b"GET /v1/gateway HTTP/1.1\r\nHost: \x00\r\n\r\n",
        "headers over 64 KiB": b"GET /v1/gateway HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    }
    for name, data in garbage.items():
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(data)
            answer = b""
            with trio.fail_after(10):
                try:
                    while chunk := await stream.receive_some(65536):
                        answer += chunk
                except trio.BrokenResourceError:  # reset: dropped with data unread
                    pass
        # Refused (4xx), dropped, or upgraded and then closed at the identify timeout.
        assert not answer or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.1 101")), name
    await bystander_still_works(node, alex, 1)
