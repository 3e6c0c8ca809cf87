"""Helpers to bring desktops live on a test node, with the kit's gateway client.

:class:`~testkit.ws.GatewayClient` (recording mode, :meth:`GatewayClient.connect`)
keeps every frame it received, in order; tests wait for frames or for the close
by polling with short sleeps (never sleeping for a delay).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from bothy_notify.kernel.metrics import Metrics
from gateway.service import Gateway
from testkit.ws import Frame, GatewayClient
from tests.harness import Node, device_token


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


__all__ = [
    "Frame",
    "GatewayClient",
    "connect_live",
    "gateway_address",
    "gateway_of",
    "gauge",
    "identify",
    "wait_until",
]
