"""A gateway test client over trio-websocket, and helpers to bring desktops live.

The client keeps every frame it received, in order; tests wait for frames or
for the close by polling with short sleeps (never sleeping for a delay).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio
import trio_websocket

from bothy_notify.kernel.metrics import Metrics
from gateway.service import Gateway
from tests.harness import Node, device_token
from tests.hostile.wsframes import client_frame

Frame = dict[str, Any]


class GatewayClient:
    """One WebSocket connection to ``/v1/gateway`` that records what it receives."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, stream: trio.SocketStream) -> None:
        self.ws = ws
        self.stream = stream
        self.frames: list[Frame] = []
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.ended = False

    @classmethod
    async def connect(
        cls, nursery: trio.Nursery, address: str, *, path: str = "/v1/gateway", **kwargs: Any
    ) -> GatewayClient:
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        try:
            ws = await trio_websocket.wrap_client_stream(nursery, stream, host, path, **kwargs)
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
        client = cls(ws, stream)
        nursery.start_soon(client._read)
        return client

    async def _read(self) -> None:
        try:
            while True:
                message = await self.ws.get_message()
                self.frames.append(json.loads(message))
        except trio_websocket.ConnectionClosed as exc:
            if exc.reason is not None:
                self.close_code, self.close_reason = exc.reason.code, exc.reason.reason
        finally:
            self.ended = True
            # trio-websocket leaves a client's socket open after the server closed it.
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def send(self, op: str, d: Any = None) -> None:
        frame: Frame = {"op": op}
        if d is not None:
            frame["d"] = d
        await self.ws.send_message(json.dumps(frame))

    async def send_raw(self, message: str | bytes) -> None:
        await self.ws.send_message(message)

    async def send_text_bytes(self, payload: bytes) -> None:
        """One text frame of ``payload`` as it is, UTF-8 or not, written straight to
        the socket (the library only sends valid text)."""
        await self.stream.send_all(client_frame(payload))

    async def wait_for(
        self, predicate: Callable[[Frame], bool], *, after: int = 0, timeout: float = 10.0
    ) -> Frame:
        """The first frame at index ``after`` or later that matches ``predicate``."""
        with trio.fail_after(timeout):
            while True:
                for frame in self.frames[after:]:
                    if predicate(frame):
                        return frame
                if self.ended:
                    raise AssertionError(f"connection closed ({self.close_code}) while waiting")
                await trio.sleep(0.005)

    async def wait_op(self, op: str, *, after: int = 0, timeout: float = 10.0) -> Frame:
        return await self.wait_for(lambda f: f.get("op") == op, after=after, timeout=timeout)

    async def wait_closed(self, timeout: float = 10.0) -> tuple[int | None, str | None]:
        with trio.fail_after(timeout):
            while not self.ended:
                await trio.sleep(0.005)
        return self.close_code, self.close_reason

    def notifications(self) -> list[Frame]:
        return [f for f in self.frames if f.get("type") == "notification.created"]

    async def focus(self, thread_ids: list[str], *, idle: bool = False) -> Frame:
        mark = len(self.frames)
        await self.send("focus", {"thread_ids": thread_ids, "idle": idle})
        return await self.wait_op("focus.ack", after=mark)

    async def read(self, thread_id: str, seq: int) -> Frame:
        mark = len(self.frames)
        await self.send("read", {"thread_id": thread_id, "seq": seq})
        return await self.wait_op("read.ack", after=mark)

    async def close(self) -> None:
        await self.ws.aclose()


def gateway_of(node: Node) -> Gateway:
    gateway = node.daemon.gateway
    assert isinstance(gateway, Gateway)
    return gateway


def gateway_address(node: Node) -> str:
    assert node.addresses.gateway is not None
    return node.addresses.gateway


async def identify(client: GatewayClient, token: str) -> None:
    await client.wait_op("hello")
    await client.send("identify", {"token": token})


async def connect_live(
    nursery: trio.Nursery,
    node: Node,
    user: str,
    device: str,
    platform: str = "macos",
    *,
    kind: str = "user",
) -> GatewayClient:
    """A client that identified and received ``catchup.complete``."""
    client = await GatewayClient.connect(nursery, gateway_address(node))
    await identify(client, device_token(user, device, platform, kind))
    await client.wait_op("catchup.complete")
    return client


def gauge(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)
