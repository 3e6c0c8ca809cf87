"""Group mentions and deletions across the nodes of a cluster (issue 33): ``here``
decided by a worker reads the presence the gateway nodes share, and a deletion
decided there reaches the desktops on a gateway node as ``notification.removed``.

Real daemons in one process (real gateway on 127.0.0.1:0, one test database), a
shared fake clock so the nodes agree on who is live.
"""

from __future__ import annotations

from typing import Any

import trio

from bothy_notify.kernel.clock import FakeClock
from gateway.service import build_gateway
from tests.cluster.support import cluster_config
from tests.gateway.client import connect_live
from tests.gateway.world import world
from tests.harness import Launch, Node, ev


async def api_and_worker(launch: Launch, clock: FakeClock) -> tuple[Node, Node]:
    api = await launch(gateway_factory=build_gateway, config=cluster_config("api"), clock=clock)
    worker = await launch(config=cluster_config("worker"), clock=clock)
    return api, worker


def message(seq: int, *groups: str) -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id="t1",
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id="robin",
        mentions=[],
        mention_groups=list(groups),
    )


async def test_here_decided_by_a_worker_mentions_the_present_on_a_gateway_node(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    api, worker = await api_and_worker(launch, clock)
    await world(api)  # Alex reads s1, Sam reads c1, both follow t1 (level all)
    alex = await connect_live(nursery, api, "alex", "alex-desktop", "linux")
    sam = await connect_live(nursery, api, "sam", "sam-desktop", "linux")
    await alex.focus([])  # acknowledged once the shared presence holds it
    await sam.focus([], idle=True)

    await api.append(message(1, "here"))
    await worker.settle()

    to_alex = await alex.wait_for(lambda f: f.get("type") == "notification.created")
    to_sam = await sam.wait_for(lambda f: f.get("type") == "notification.created")
    assert to_alex["payload"]["kind"] == "mention"
    assert to_sam["payload"]["kind"] == "message"  # idle: a follower, not mentioned


async def test_a_deletion_decided_by_a_worker_reaches_the_desktop_on_a_gateway_node(
    launch: Launch, nursery: trio.Nursery, clock: FakeClock
) -> None:
    api, worker = await api_and_worker(launch, clock)
    await world(api)
    alex = await connect_live(nursery, api, "alex", "alex-desktop", "linux")
    await alex.focus([])
    await api.append(message(1), message(2))
    await worker.settle()

    await api.append(
        ev(
            "message.deleted",
            thread_id="t1",
            message_id="m2",
            thread_seq=2,
            author_id="robin",
            mentions=[],
            last_seq=1,
        )
    )
    await worker.settle()

    frame = await alex.wait_for(lambda f: f.get("type") == "notification.removed")
    assert frame["payload"] == {"thread_id": "t1", "message_id": "m2", "badge": 1}
