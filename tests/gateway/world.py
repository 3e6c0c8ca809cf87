"""The test world of the gateway tests, and small observers.

Alex follows thread t1 (space s1, channel c1) with level ``all`` and reads
every thread of s1; Sam reads channel c1 only and follows t1 too; Robin writes
and reads nothing. Alex's phone (ios) is registered with the fake provider
(token ``alex-token``); Alex's desktop (macos) and laptop (windows) have no
registration and reach Alex only over the gateway.
"""

from __future__ import annotations

from typing import Any

from gateway.service import build_gateway
from tests.harness import Launch, Node, ev, make_config

PUSH_SEND = "notify.push_send"
GATEWAY_SEND = "notify.gateway_send"
DELAY = 120.0
"""``notify.mobile_delay_when_desktop_active`` of the test configuration (2m)."""


async def start(launch: Launch, **sections: Any) -> Node:
    """A role ``all`` node with the real gateway and the world in place."""
    node = await launch(gateway_factory=build_gateway, config=make_config(**sections))
    await world(node)
    return node


async def world(node: Node) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("user.upserted", user_id="robin", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1", channel_id="c1"),
        ev("thread.upserted", thread_id="t2", space_id="s1", channel_id="c2"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="c1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
        ev("thread.followed", user_id="sam", thread_id="t1", level="all"),
    )
    await node.register("alex", "alex-phone", "alex-token")
    await node.settle()


def message(seq: int, *, thread: str = "t1", author: str = "robin") -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id=author,
        mentions=[],
    )


async def jobs_for(node: Node, kind: str, user: str = "alex") -> list[dict[str, Any]]:
    return [j for j in await node.jobs(kind) if j["args"].get("user_id") == user]


def pushes(node: Node, token: str = "alex-token") -> list[dict[str, Any]]:
    return [s.payload for s in node.fake.sends if s.token == token]
