"""Helpers of the in-process cluster tests: registries on the test's database, rows
of the shared tables, and a hub with connections driven through its own API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from bothy_notify.auth import DeviceClaims
from bothy_notify.cluster import NodeRegistry
from bothy_notify.config import Config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.store.db import Conn, Database
from gateway.connection import Connection
from gateway.hub import Hub
from tests.harness import make_config

TIMEOUT = timedelta(seconds=2)
"""``cluster.node_timeout`` of these tests."""


def cluster_config(role: str = "all", **sections: Any) -> Config:
    """A node of a cluster: heartbeat 200 ms, node timeout 2 s."""
    server = {"role": role, "heartbeat": "200ms", **sections.pop("server", {})}
    cluster = {"mode": "multi", "node_timeout": "2s", **sections.pop("cluster", {})}
    return make_config(server=server, cluster=cluster, **sections)


def registry(
    db: Database, clock: FakeClock, role: str = "all", metrics: Metrics | None = None
) -> NodeRegistry:
    return NodeRegistry(
        db=db,
        clock=clock,
        config=cluster_config(role),
        metrics=metrics or Metrics(),
        node_id=new_id(),
    )


async def sql(db: Database, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    def run(conn: Conn) -> list[tuple[Any, ...]]:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    return await db.run(run)


async def presence_rows(db: Database) -> list[tuple[Any, ...]]:
    """(user, device, node, platform, focus, idle) of every shared presence row."""
    return await sql(
        db,
        "SELECT user_id, device_id, node_id::text, platform, focus, idle FROM bothy.presence"
        " ORDER BY user_id, device_id, node_id",
    )


def connect(
    hub: Hub, user: str, device: str, platform: str = "macos", *, kind: str = "user"
) -> Connection:
    """A live connection in ``hub`` (identified, ``catchup.complete`` written)."""
    conn = hub.open()
    hub.identify(conn, DeviceClaims(user, device, platform, kind))
    assert hub.go_live(conn)
    return conn
