"""Helpers of the real-process cluster tests: the configuration of a cluster node,
the world, HTTP and SQL against running daemons, gateway clients, metrics.

Every wait polls a condition under an absolute timeout; nothing sleeps for a delay.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.client import GatewayClient, identify
from tests.harness import device_token, ev, producer_token
from tests.procs import DaemonProcess, read_fake_records

DELAY = 2.0
"""``notify.mobile_delay_when_desktop_active`` of these tests, in seconds."""
NODE_TIMEOUT = 2.0
"""``cluster.node_timeout`` of these tests, in seconds."""

CLUSTER: dict[str, Any] = {
    "server": {"heartbeat": "200ms"},
    "cluster": {"mode": "multi", "node_timeout": "2s"},
    "notify": {"mobile_delay_when_desktop_active": "2s", "poll_interval": "200ms"},
    "jobs": {"lease": "2s"},
}
"""Sections of every node of these tests (merged over the tests' base configuration)."""

GATEWAY_SEND = "notify.gateway_send"
PUSH_SEND = "notify.push_send"


def node_config(role: str, **extra: Any) -> dict[str, Any]:
    """The sections of a cluster node with ``role`` (``extra`` merged per section)."""
    sections = {name: dict(values) for name, values in CLUSTER.items()}
    sections["server"]["role"] = role
    for name, values in extra.items():
        sections.setdefault(name, {}).update(values)
    return sections


async def until(predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``timeout`` seconds."""
    with trio.move_on_after(timeout):
        while not await predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    """The test's view of a running cluster: HTTP, SQL, pushes, metrics."""

    def __init__(self, url: str, records: Path, http: httpx.AsyncClient) -> None:
        self.url = url
        self.records = records
        self.http = http

    async def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            with psycopg.connect(self.url, autocommit=True) as conn:
                cur = conn.execute(query, params)
                return cur.fetchall() if cur.description else []

        return await trio.to_thread.run_sync(run)

    async def append(self, node: DaemonProcess, *events: dict[str, Any]) -> list[int]:
        response = await self.http.post(
            f"{node.api_url}/v1/events",
            json={"events": list(events)},
            headers={"authorization": f"Bearer {producer_token()}"},
        )
        assert response.status_code == 200, response.text
        seqs: list[int] = response.json()["seqs"]
        return seqs

    async def outbox(self, *events: dict[str, Any]) -> None:
        """Append in the producer's own transaction (``bothy.append_event``), as an app's
        outbox does: no node's HTTP API needed."""
        for event in events:
            await self.sql(
                "SELECT bothy.append_event(%s, %s::jsonb)",
                (event["type"], json.dumps(event["payload"])),
            )

    async def register(
        self, node: DaemonProcess, user: str, device: str, token: str, platform: str = "ios"
    ) -> None:
        response = await self.http.post(
            f"{node.api_url}/v1/registrations",
            json={"provider": "fake", "token": token},
            headers={"authorization": f"Bearer {device_token(user, device, platform)}"},
        )
        assert response.status_code in (200, 201), response.text

    async def read(
        self, node: DaemonProcess, user: str, device: str, thread: str, seq: int
    ) -> None:
        response = await self.http.put(
            f"{node.api_url}/v1/threads/{thread}/read",
            json={"seq": seq},
            headers={"authorization": f"Bearer {device_token(user, device, 'macos')}"},
        )
        assert response.status_code == 200, response.text

    async def readyz(self, node: DaemonProcess) -> dict[str, Any]:
        body: dict[str, Any] = (await self.http.get(f"{node.api_url}/readyz")).json()
        return body

    async def node_id(self, node: DaemonProcess) -> str:
        node_id: str = (await self.readyz(node))["cluster"]["node_id"]
        return node_id

    async def metric(self, node: DaemonProcess, name: str, **labels: str) -> float:
        """A sample of ``node``'s ``/metrics`` (0 when absent)."""
        text = (await self.http.get(f"{node.api_url}/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def pushes(self, token: str) -> list[dict[str, Any]]:
        """Hint payloads the fake provider sent to ``token``, from every node's records
        (a clearing push, kind ``read``, answers a read and is left out)."""
        return [
            r["payload"]
            for r in read_fake_records(self.records)
            if r["token"] == token and r["payload"].get("kind") != "read"
        ]

    async def settled(self, timeout: float = 20.0) -> None:
        """Every event consumed and no job running or due."""

        async def done() -> bool:
            ((behind, busy),) = await self.sql(
                "SELECT (SELECT coalesce(max(seq), 0) FROM bothy.events)"
                "   - (SELECT seq FROM bothy.consumer_cursor WHERE name = 'notify'),"
                " (SELECT count(*) FROM bothy.jobs WHERE state = 'running'"
                "   OR (state = 'available' AND scheduled_at <= now()))"
            )
            return bool(behind <= 0 and busy == 0)

        await until(done, "the cluster to settle", timeout)

    async def jobs(self, kind: str, user: str) -> list[dict[str, Any]]:
        rows = await self.sql(
            "SELECT id, args, state, node_id::text, scheduled_at, created_at, last_error"
            " FROM bothy.jobs WHERE kind = %s AND args->>'user_id' = %s ORDER BY id",
            (kind, user),
        )
        keys = ("id", "args", "state", "node_id", "scheduled_at", "created_at", "last_error")
        return [dict(zip(keys, r, strict=True)) for r in rows]


WORLD = [
    ev("user.upserted", user_id="alex", kind="human", active=True),
    ev("user.upserted", user_id="sam", kind="human", active=True),
    ev("user.upserted", user_id="robin", kind="human", active=True),
    ev("thread.upserted", thread_id="t1", space_id="s1"),
    ev("thread.upserted", thread_id="t2", space_id="s1"),
    ev("member.added", user_id="alex", scope_id="s1"),
    ev("member.added", user_id="sam", scope_id="s1"),
    ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    ev("thread.followed", user_id="sam", thread_id="t1", level="all"),
]
"""Alex and Sam read space s1 (threads t1, t2) and follow t1; Robin writes."""


def message(seq: int, thread: str = "t1", author: str = "robin") -> dict[str, Any]:
    return ev(
        "message.created",
        thread_id=thread,
        message_id=f"m{seq}",
        thread_seq=seq,
        author_id=author,
        mentions=[],
    )


async def live(
    nursery: trio.Nursery, node: DaemonProcess, user: str, device: str, platform: str = "macos"
) -> GatewayClient:
    """A gateway client on ``node`` that received ``catchup.complete`` and whose (empty)
    focus was acknowledged, so its presence is shared with the cluster."""
    assert node.gateway is not None
    client = await GatewayClient.connect(nursery, node.gateway)
    await identify(client, device_token(user, device, platform))
    await client.wait_op("catchup.complete")
    await client.focus([])
    return client


def hints(client: GatewayClient, message_id: str | None = None) -> list[dict[str, Any]]:
    """The ``notification.created`` payloads ``client`` received (for one message)."""
    return [
        f["payload"]
        for f in client.notifications()
        if message_id is None or f["payload"].get("message_id") == message_id
    ]
