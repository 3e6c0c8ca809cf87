"""Hostile input against a real ``bothy-notify run`` process: every answer is the
constant one, the daemon stays up and ready, another client keeps working, and
the log shows neither a traceback nor anything the input carried."""

from __future__ import annotations

import httpx
import pytest
import trio

from testkit.ws import GatewayClient, client_frame
from tests.faults.conftest import DaemonFactory
from tests.faults.world import closing_count, count_pushes, register_phone, wait_settled
from tests.harness import TEST_KEY, device_token, producer_token
from tests.hostile.rawhttp import exchange, request_bytes, trickle
from tests.hostile.tokens import malformed_device_tokens
from tests.procs import DaemonProcess

MARKERS = ("mallory", "alex", "t-secret", TEST_KEY)
"""What the hostile input and the test world carry; none of it may reach the log."""


def token(user: str, device: str, platform: str = "linux") -> str:
    return device_token(user, device, platform)


async def start_hostile(daemons: DaemonFactory) -> DaemonProcess:
    """A daemon with short HTTP timeouts and a small unidentified-connection cap."""
    return await daemons(
        "hostile",
        server={"body_timeout": "500ms", "header_timeout": "500ms"},
        sync={"identify_timeout": "2s", "write_timeout": "1s", "max_unidentified_connections": 40},
    )


async def live_desktop(gateway: str, user: str) -> GatewayClient:
    """A desktop that identified and read ``catchup.complete`` (read only when asked)."""
    client = await GatewayClient.open(gateway)
    await client.identify(token(user, f"{user}-desktop", "linux"))
    return client


async def gateway_close(gateway: str, frame: bytes) -> tuple[int | None, str | None]:
    """Connect, send ``frame`` (raw bytes) after hello, and return the server's close."""
    raw = await GatewayClient.open(gateway, receive_buffer=4096)
    try:
        with trio.fail_after(10):
            assert await raw.wait_hello()
            await raw.stream.send_all(frame)
            await raw.read_until(lambda f: False)
    finally:
        await raw.aclose()
    return raw.close_code, raw.close_reason


async def flood(gateway: str, count: int) -> None:
    """``count`` connections that never upgrade, each dropped by the client in turn."""
    host, _, port = gateway.rpartition(":")
    streams: list[trio.SocketStream] = []
    try:
        for _ in range(count):
            streams.append(await trio.open_tcp_stream(host, int(port)))
    finally:
        for stream in streams:
            await stream.aclose()


@pytest.mark.slow
async def test_a_real_daemon_answers_hostile_input_and_keeps_serving(
    daemons: DaemonFactory, fault_db: str
) -> None:
    node = await start_hostile(daemons)
    pid = node.pid
    api, gateway = node.api, node.gateway
    assert gateway is not None
    try:
        async with httpx.AsyncClient(base_url=node.api_url, timeout=10) as http:
            events = [
                {
                    "type": "user.upserted",
                    "payload": {"user_id": "alex", "kind": "human", "active": True},
                },
                {"type": "thread.upserted", "payload": {"thread_id": "t-secret", "space_id": "s1"}},
                {"type": "member.added", "payload": {"user_id": "alex", "scope_id": "s1"}},
                {
                    "type": "thread.followed",
                    "payload": {"user_id": "alex", "thread_id": "t-secret", "level": "all"},
                },
            ]
            headers = {"authorization": f"Bearer {producer_token()}"}
            assert (
                await http.post("/v1/events", json={"events": events}, headers=headers)
            ).status_code == 200
            await register_phone(http, api, "alex")
            alex = await live_desktop(gateway, "alex")

            # HTTP: every malformed token, a trickled body, two Authorization headers.
            for name, bad in malformed_device_tokens():
                answer = await exchange(
                    api,
                    request_bytes(
                        "GET",
                        "/v1/preferences",
                        [(b"Authorization", b"Bearer " + bad.encode("utf-8", "surrogatepass"))],
                    ),
                )
                assert answer.status == 401, name
            slow = request_bytes(
                "PUT",
                "/v1/preferences",
                [(b"Authorization", b"Bearer " + token("mallory", "m1").encode())],
                b'{"categories":{}}' + b" " * 5000,
            )
            assert (
                await trickle(api, slow, pause=0.01, at_once=slow.index(b"\r\n\r\n") + 4)
            ).status == 408
            twice = request_bytes(
                "GET",
                "/v1/preferences",
                [(b"Authorization", b"Bearer " + token("mallory", "m1").encode())] * 2,
            )
            assert (await exchange(api, twice)).status == 401

            # Gateway: nesting too deep, invalid UTF-8, a token that cannot be UTF-8 encoded,
            # a flood of connections that never identify.
            deep = b'{"op":"ping","d":' + b"[" * 20_000 + b"]" * 20_000 + b"}"
            assert await gateway_close(gateway, client_frame(deep)) == (4003, "malformed frame")
            assert await gateway_close(gateway, client_frame(b'{"op":"\xff"}')) == (
                1007,
                "invalid utf-8",
            )
            surrogate = b'{"op":"identify","d":{"token":"\\ud800"}}'
            assert await gateway_close(gateway, client_frame(surrogate)) == (
                4001,
                "authentication failed",
            )
            await flood(gateway, 200)

            # The bystander still hears about a new message, and the node is ready.
            message = {
                "thread_id": "t-secret",
                "message_id": "m1",
                "thread_seq": 1,
                "author_id": "sam",
                "mentions": [],
            }
            sent = await http.post(
                "/v1/events",
                json={"events": [{"type": "message.created", "payload": message}]},
                headers=headers,
            )
            assert sent.status_code == 200
            with trio.fail_after(15):
                while (await alex.op()).get("type") != "notification.created":
                    pass
            await alex.close()
            await wait_settled(fault_db)
        # Every event decided, the phone's one push recorded once, the same process ready.
        pushes = count_pushes(
            node.config_file.parent / "pushes.jsonl", {("m1", "phone-token-alex")}
        )
        await closing_count(fault_db, node, pushes, pid=pid)
    finally:
        code = await node.stop()
    assert code == 0
    text = node.log_text()
    assert "Traceback" not in text
    for marker in MARKERS:
        assert marker not in text, marker
