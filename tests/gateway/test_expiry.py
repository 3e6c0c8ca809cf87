"""A connection ends with its token: 4001 ``token expired`` at ``exp`` plus
``auth.leeway`` on the injected clock, unless ``reauth`` brought a fresh token of
the same identity first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from bothy_notify.auth import mint_token
from bothy_notify.kernel.clock import FakeClock
from gateway.service import Gateway, build_gateway
from tests.gateway.client import (
    GatewayClient,
    gateway_address,
    gateway_of,
    gauge,
    identify,
    wait_until,
)
from tests.harness import TEST_KEY, Launch, Node, device_token, make_config

EXPIRED = (4001, "token expired")
AUTH_FAILED = (4001, "authentication failed")
LEEWAY = 30


def token(lifetime: float, *, now: datetime, **claims: str) -> str:
    identity = {"sub": "alex", "did": "alex-desktop", "plat": "macos", "kind": "user"}
    return mint_token(
        TEST_KEY, {**identity, **claims}, lifetime=timedelta(seconds=lifetime), now=now
    )


async def node_at_now(launch: Launch) -> tuple[Node, datetime]:
    """A node whose fake clock starts at the real time (tokens are minted on it too)."""
    now = datetime.now(UTC).replace(microsecond=0)
    node = await launch(
        gateway_factory=build_gateway,
        clock=FakeClock(now),
        config=make_config(auth={"leeway": f"{LEEWAY}s"}),
    )
    return node, now


async def live(nursery: trio.Nursery, node: Node, jwt: str) -> GatewayClient:
    client = await GatewayClient.connect(nursery, gateway_address(node))
    await identify(client, jwt)
    await client.wait_op("catchup.complete")
    return client


async def still_open(client: GatewayClient) -> bool:
    mark = len(client.frames)
    await client.send("ping")
    await client.wait_op("pong", after=mark)
    return not client.ended


async def reauth(client: GatewayClient, jwt: str) -> dict[str, object]:
    mark = len(client.frames)
    await client.send("reauth", {"token": jwt})
    return await client.wait_op("reauth.ack", after=mark)


async def test_a_connection_closes_with_4001_when_its_token_expires_past_the_leeway(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    client = await live(nursery, node, token(600, now=now))

    node.clock.advance(600 + LEEWAY - 1)
    assert await still_open(client)

    node.clock.advance(1)
    assert await client.wait_closed() == EXPIRED


async def test_reauth_with_a_fresh_token_moves_the_expiry(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    client = await live(nursery, node, token(600, now=now))

    ack = await reauth(client, token(3600, now=now))

    assert ack == {"op": "reauth.ack", "d": {"exp": int(now.timestamp()) + 3600}}
    node.clock.advance(600 + LEEWAY)
    assert await still_open(client)
    node.clock.advance(3000)
    assert await client.wait_closed() == EXPIRED


async def test_reauth_with_a_token_of_another_identity_closes_with_4001(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    others = {
        "person": {"sub": "sam"},
        "device": {"did": "alex-laptop"},
        "platform": {"plat": "windows"},
        "kind": {"kind": "agent"},
    }
    for what, claims in others.items():
        client = await live(nursery, node, token(600, now=now))

        await client.send("reauth", {"token": token(3600, now=now, **claims)})

        assert await client.wait_closed() == AUTH_FAILED, what


async def test_reauth_with_a_malformed_or_expired_token_closes_with_4001(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    for bad in ("not-a-jwt", token(-3600, now=now), mint_token("x" * 40, {"sub": "alex"})):
        client = await live(nursery, node, token(600, now=now))

        await client.send("reauth", {"token": bad})

        assert await client.wait_closed() == AUTH_FAILED


async def test_a_token_expired_within_the_leeway_is_closed_once_the_leeway_is_over(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    client = await live(nursery, node, token(-10, now=now))  # still inside the 30 s leeway

    node.clock.advance(LEEWAY - 10)

    assert await client.wait_closed() == EXPIRED


async def test_ended_connections_are_no_longer_watched(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    clients = [await live(nursery, node, token(600, now=now, did=f"d{i}")) for i in range(3)]
    watch = gateway_of(node)._expiry
    assert len(watch) == 3

    for client in clients:
        await client.close()

    await wait_until(lambda: len(watch) == 0)


async def test_other_connections_outlive_one_that_expired(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node, now = await node_at_now(launch)
    short = await live(nursery, node, token(60, now=now))
    other = await live(nursery, node, device_token("sam", "sam-desktop", "macos"))

    node.clock.advance(60 + LEEWAY)

    assert await short.wait_closed() == EXPIRED
    assert await still_open(other)


class FailsOnce:
    """The node's clock, except that the first wait asked of it fails: a stand-in
    for any bug in the expiry watch's loop."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.failures = 0

    def now(self) -> datetime:
        return self._clock.now()

    async def sleep_until(self, when: datetime) -> None:
        if self.failures == 0:
            self.failures += 1
            raise RuntimeError("the expiry watch broke")
        await self._clock.sleep_until(when)


async def test_a_failing_expiry_watch_is_restarted_and_still_closes_on_time(
    launch: Launch, nursery: trio.Nursery
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    clock = FakeClock(now)
    broken = FailsOnce(clock)

    def gateway_with_a_broken_clock(**parts: Any) -> Gateway:
        return build_gateway(**{**parts, "clock": broken})

    node = await launch(
        gateway_factory=gateway_with_a_broken_clock,
        clock=clock,
        config=make_config(auth={"leeway": f"{LEEWAY}s"}),
    )
    short = await live(nursery, node, token(60, now=now))  # its watch fails on this one
    other = await live(nursery, node, device_token("sam", "sam-desktop", "macos"))
    await wait_until(
        lambda: gauge(node.metrics, "bothy_service_restarts_total", service="expiry") == 1
    )
    await wait_until(lambda: gateway_of(node).readiness()["expiry"])
    assert broken.failures == 1
    assert (await node.request("GET", "/readyz")).status_code == 200

    node.clock.advance(60 + LEEWAY)

    assert await short.wait_closed() == EXPIRED
    assert await still_open(other)
