"""PostgreSQL stops and starts again under a running daemon.

The daemon stays up; meanwhile endpoints that need the database answer 503
``unavailable``, ``/readyz`` is 503 with the database check false, and the
round's check goes false once its connection is gone. When the database is
back, everything resumes on its own: no restart, nothing appended is lost.
The server is an embedded PostgreSQL of this test's own (never the session's).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from bothy_notify.kernel.clock import FakeClock
from bothy_notify.store.migrate import migrate
from tests.harness import Node, device_token, ev, make_config, producer_token, start_node, wait_for
from tests.procs import PgCluster


def _start_migrated(postgres: PgCluster) -> None:
    postgres.start()
    with psycopg.connect(postgres.url) as conn:
        migrate(conn)


@pytest.fixture
async def server() -> AsyncIterator[PgCluster]:
    """An embedded PostgreSQL of this test's own (stopping the session's would break
    every other test); its URL stays the same across a stop and a start."""
    home = Path(tempfile.mkdtemp(prefix="bothy-stop-"))
    postgres = PgCluster(home)
    try:
        await trio.to_thread.run_sync(_start_migrated, postgres)
        yield postgres
    finally:
        await trio.to_thread.run_sync(postgres.close)
        shutil.rmtree(home, ignore_errors=True)


async def setup_people(node: Node) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
    )
    await node.register("alex", "phone", "tok")


def message(n: int) -> dict[str, object]:
    return ev("message.created", thread_id="t1", message_id=f"m{n}", thread_seq=n, author_id="sam")


async def post_events(node: Node, *events: dict[str, object]) -> httpx.Response:
    return await node.http.post(
        f"{node.api}/v1/events",
        json={"events": list(events)},
        headers={"authorization": f"Bearer {producer_token()}"},
    )


@pytest.mark.slow
async def test_the_daemon_rides_out_a_database_outage_and_resumes_on_its_own(
    server: PgCluster,
) -> None:
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, server.url, clock=FakeClock(), config=make_config())
        await setup_people(node)
        await node.append(message(1))
        await wait_for(lambda: _sent(node, 1), timeout=15, what="the first push")

        await trio.to_thread.run_sync(server.stop)
        answers: dict[str, httpx.Response] = {}

        async def ask(name: str, method: str, path: str, kw: dict[str, Any]) -> None:
            answers[name] = await node.http.request(method, f"{node.api}{path}", **kw)

        producer = {"authorization": f"Bearer {producer_token()}"}
        device = {"authorization": f"Bearer {device_token('alex', 'phone')}"}
        async with trio.open_nursery() as asking:
            asking.start_soon(ask, "readyz", "GET", "/readyz", {})
            events = {"json": {"events": [message(2)]}, "headers": producer}
            asking.start_soon(ask, "events", "POST", "/v1/events", events)
            asking.start_soon(ask, "registrations", "GET", "/v1/registrations", {"headers": device})
        assert answers["readyz"].status_code == 503
        assert answers["readyz"].json()["checks"]["database"] is False
        for name in ("events", "registrations"):
            assert answers[name].status_code == 503, name
            assert answers[name].json()["error"]["code"] == "unavailable"
            assert answers[name].headers["retry-after"] == "2"
        assert node.daemon.round is not None
        await wait_for(
            lambda: _false(node.daemon.round is not None and node.daemon.round.connected),
            timeout=15,
            what="the round to notice",
        )
        ready = await node.request("GET", "/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["round"] is False
        assert (await node.request("GET", "/healthz")).status_code == 200

        async def marked_unreachable() -> bool:
            answer = await node.request("GET", "/v1/registrations", headers=device)
            assert answer.status_code == 503
            return node.db.unreachable

        # Once a wait for a connection timed out, requests are answered without waiting
        # (one probe a second still tries the database).
        await wait_for(marked_unreachable, timeout=20, what="the pool to give up waiting")

        await trio.to_thread.run_sync(server.start)

        async def ready_again() -> bool:
            return (await node.request("GET", "/readyz")).status_code == 200

        await wait_for(ready_again, timeout=30, what="readiness after the outage")

        async def appended() -> bool:
            return (await post_events(node, message(2))).status_code == 200

        await wait_for(appended, timeout=15, what="an append after the outage")
        assert not node.db.unreachable
        await wait_for(lambda: _sent(node, 2), timeout=15, what="the push after the outage")
        assert [s.payload["message_id"] for s in node.fake.sends] == ["m1", "m2"]
        assert {name: s.restarts for name, s in node.daemon.services.items()} == {
            "memory": 0,
            "housekeeper": 0,
            "runner": 0,
            "round": 0,
        }
        nursery.cancel_scope.cancel()
    await node.http.aclose()


async def _sent(node: Node, n: int) -> bool:
    await trio.lowlevel.checkpoint()
    return len(node.fake.sends) >= n


async def _false(value: bool) -> bool:
    await trio.lowlevel.checkpoint()
    return not value
