"""Test helpers: a test configuration, tokens, and a running node to talk to.

A :class:`Node` is a real daemon (``bothy_notify.wiring.Daemon``) on the test's
database, serving HTTP on 127.0.0.1 port 0, with a fake clock and an in-memory
fake provider. :meth:`Node.settle` waits (polling, never sleeping for a delay)
until every event is consumed and every due job has finished.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from bothy_notify.auth import mint_token
from bothy_notify.config import Config, structure_config
from bothy_notify.kernel.clock import FakeClock
from bothy_notify.kernel.metrics import Metrics
from bothy_notify.push.fake import FakeProvider
from bothy_notify.push.port import PushProvider
from bothy_notify.store.db import Conn, Database
from bothy_notify.wiring import Daemon, GatewayFactory, NodeAddresses

TEST_KEY = "test-only-hs256-key-0123456789abcdef"

BASE: dict[str, Any] = {
    "server": {
        "api_listen": "127.0.0.1:0",
        "gateway_listen": "127.0.0.1:0",
        "dev": True,
        "drain_period": "2s",
    },
    "auth": {"keys": [{"algorithm": "HS256", "key": TEST_KEY}]},
    "notify": {
        "poll_interval": "50ms",
        "coalesce_window": "0s",
        "mobile_delay_when_desktop_active": "2m",
        "default_level": "mentions",
    },
    "push": {"fake": {}},
    "jobs": {"lease": "30s"},
    "log": {"level": "warning", "format": "text"},
}


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_config(**sections: Mapping[str, Any]) -> Config:
    """The test configuration with ``sections`` merged in (e.g. ``notify={...}``)."""
    return structure_config(_merge(BASE, sections), env={})


def device_token(user: str, device: str, platform: str = "ios", kind: str = "user") -> str:
    return mint_token(TEST_KEY, {"sub": user, "did": device, "plat": platform, "kind": kind})


def producer_token(scope: str = "events:write") -> str:
    return mint_token(TEST_KEY, {"sub": "backend", "scope": scope})


def ev(type_: str, **payload: Any) -> dict[str, Any]:
    """An event as the producer sends it."""
    return {"type": type_, "payload": payload}


def two_followed_threads() -> list[dict[str, Any]]:
    """Alex and Sam, members of space s1; threads t1 and t2 in it, both followed by
    Alex at level ``all`` (Sam writes there in the tests that use it)."""
    return [
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("user.upserted", user_id="sam", kind="human", active=True),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("thread.upserted", thread_id="t2", space_id="s1"),
        ev("thread.followed", user_id="alex", thread_id="t1", level="all"),
        ev("thread.followed", user_id="alex", thread_id="t2", level="all"),
    ]


@dataclass
class Node:
    """A running daemon and the means to drive and observe it."""

    daemon: Daemon
    addresses: NodeAddresses
    clock: FakeClock
    fake: FakeProvider
    db: Database
    http: httpx.AsyncClient
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def api(self) -> str:
        assert self.addresses.api is not None
        return f"http://{self.addresses.api}"

    async def append(self, *events: dict[str, Any]) -> list[int]:
        """Append through ``POST /v1/events``; fail the test on a non-200 answer."""
        response = await self.http.post(
            f"{self.api}/v1/events",
            json={"events": list(events)},
            headers={"authorization": f"Bearer {producer_token()}"},
        )
        assert response.status_code == 200, response.text
        seqs: list[int] = response.json()["seqs"]
        return seqs

    async def register(
        self,
        user: str,
        device: str,
        token: str,
        *,
        platform: str = "ios",
        provider: str = "fake",
        **extra: Any,
    ) -> dict[str, Any]:
        response = await self.http.post(
            f"{self.api}/v1/registrations",
            json={"provider": provider, "token": token, **extra},
            headers={"authorization": f"Bearer {device_token(user, device, platform)}"},
        )
        assert response.status_code in (200, 201), response.text
        body: dict[str, Any] = response.json()
        return body

    async def request(
        self, method: str, path: str, *, token: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return await self.http.request(method, f"{self.api}{path}", headers=headers, **kwargs)

    async def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        def run(conn: Conn) -> list[tuple[Any, ...]]:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

        return await self.db.run(run)

    async def jobs(self, kind: str | None = None) -> list[dict[str, Any]]:
        rows = await self.sql(
            "SELECT id, kind, args, state, scheduled_at, attempt, last_error FROM bothy.jobs"
            + (" WHERE kind = %s" if kind else "")
            + " ORDER BY id",
            (kind,) if kind else (),
        )
        keys = ("id", "kind", "args", "state", "scheduled_at", "attempt", "last_error")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    async def settle(self, timeout: float = 15.0) -> None:
        """Wait until all events are consumed and no due job is waiting or running."""
        with trio.fail_after(timeout):
            while True:
                now = self.clock.now()
                rows = await self.sql(
                    "SELECT (SELECT coalesce(max(seq), 0) FROM bothy.events)"
                    "   - (SELECT seq FROM bothy.consumer_cursor WHERE name = 'notify'),"
                    " (SELECT count(*) FROM bothy.jobs WHERE state = 'running'"
                    "   OR (state = 'available' AND scheduled_at <= %s))",
                    (now,),
                )
                behind, busy = rows[0]
                if behind <= 0 and busy == 0:
                    return
                if self.daemon.runner is not None:
                    self.daemon.runner.nudge()
                await trio.sleep(0.01)

    async def advance(self, seconds: float) -> None:
        """Move the fake clock and let everything that became due run."""
        self.clock.advance(seconds)
        if self.daemon.runner is not None:
            self.daemon.runner.nudge()
        await self.settle()

    def skipped(self, reason: str) -> float:
        return self.daemon.metrics.skipped(reason)


Launch = Callable[..., Awaitable[Node]]
"""The ``launch`` fixture: ``node = await launch(config=..., clock=...)``."""


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``predicate`` every 10 ms until it holds (fails after ``timeout`` seconds)."""
    with trio.move_on_after(timeout):
        while not await predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def start_node(
    nursery: trio.Nursery,
    database_url: str,
    *,
    clock: FakeClock | None = None,
    config: Config | None = None,
    providers: Mapping[str, PushProvider] | None = None,
    gateway_factory: GatewayFactory | None = None,
    **daemon_kwargs: Any,
) -> Node:
    """Start a daemon in ``nursery``; cancel the nursery (or the test ends) to stop it."""
    clock = clock or FakeClock()
    fake = FakeProvider()
    daemon = Daemon(
        config or make_config(),
        clock=clock,
        database_url=database_url,
        providers=providers if providers is not None else {"fake": fake},
        gateway_factory=gateway_factory,
        **daemon_kwargs,
    )
    addresses = await nursery.start(daemon.run)
    assert daemon.db is not None
    http = httpx.AsyncClient(timeout=10.0)
    return Node(daemon, addresses, clock, fake, daemon.db, http, daemon.metrics)
