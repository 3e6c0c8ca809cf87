"""Fixtures of the contract run: data it needs that the API's own operations cannot make.

Two kinds, each keyed by a name in the document, never by an operation:

- per path parameter (:data:`FIXTURES`, ``thread_id``): it runs once before the
  run against the daemon's HTTP API, and its values become that parameter's
  ``examples`` in the document the run reads;
- per schema component (:data:`SCHEMA_FIXTURES`, ``PushSubscription``): values
  that hold a condition no schema can say (a browser's key is a point on the
  P-256 curve, an expiry is still ahead). In the document the run reads the
  component keeps its schema and also takes an ``enum`` of them, so every valid
  request carries one, and an invalid one breaks the schema, not the curve.

Resources the API itself makes (registrations, recipients, subscriptions) need
no fixture: the document's ``links`` make them in the stateful phase. A new
operation whose path parameter is neither linked to nor fixtured never reaches
a 2xx, and the contract test names it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from testkit.fakes.webpush import Browser
from tests.contract.harness import fresh_name


@dataclass(frozen=True)
class Caller:
    """Who the run acts as: the person of its device token, the producer, and the
    operator (``admin:write``, which also reads the status)."""

    user_id: str
    device_token: str
    producer_token: str
    operator_token: str


Fixture = Callable[[httpx.Client, Caller], list[Any]]

PUSH_SERVICE = "push.contract.invalid"
"""The push service host of the run's Web Push subscriptions: the run's only
``push.webpush.allowed_endpoints``, a name that never resolves (RFC 6761)."""


def readable_threads(api: httpx.Client, caller: Caller) -> list[str]:
    """Two threads in a space the caller is a member of (so it may read them)."""
    space = fresh_name("contract-space")
    threads = [fresh_name("contract-thread") for _ in range(2)]
    batch = [
        {
            "type": "user.upserted",
            "payload": {"user_id": caller.user_id, "kind": "human", "active": True},
        },
        {"type": "member.added", "payload": {"user_id": caller.user_id, "scope_id": space}},
        *(
            {"type": "thread.upserted", "payload": {"thread_id": t, "space_id": space}}
            for t in threads
        ),
    ]
    answer = api.post(
        "/v1/events",
        json={"events": batch},
        headers={"authorization": f"Bearer {caller.producer_token}"},
    )
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 60  # a loaded machine delays the round by seconds
    for thread in threads:  # the round projects them shortly after the append
        while (
            api.get(
                f"/v1/threads/{thread}/follow",
                headers={"authorization": f"Bearer {caller.device_token}"},
            ).status_code
            != 200
        ):
            assert time.monotonic() < deadline, "the fixture's threads were never readable"
            time.sleep(0.05)
    return threads


def browser_subscriptions(api: httpx.Client, caller: Caller) -> list[dict[str, Any]]:
    """Three browsers' ``PushSubscription.toJSON()`` (each its own P-256 key and auth
    secret) at :data:`PUSH_SERVICE`, one with an expiry years ahead."""
    browsers = [
        Browser(
            f"browser-{n}",
            f"https://{PUSH_SERVICE}/push/{fresh_name(f'browser-{n}')}",
            ec.generate_private_key(ec.SECP256R1()),
            os.urandom(16),
        )
        for n in range(3)
    ]
    return [
        browser.subscription(expires)
        for browser, expires in zip(browsers, (None, None, 4_102_444_800_000), strict=True)
    ]  # 4_102_444_800_000: 2100-01-01


FIXTURES: Mapping[str, Fixture] = {"thread_id": readable_threads}
"""Per path parameter name, the fixture that makes values for it."""
SCHEMA_FIXTURES: Mapping[str, Fixture] = {
    "PushSubscription": browser_subscriptions,
}
"""Per schema component (``#/components/schemas/<name>``), the fixture of its values."""


@dataclass(frozen=True)
class Examples:
    """What the fixtures made: values per path parameter and per schema component."""

    parameters: dict[str, list[Any]]
    schemas: dict[str, list[Any]]


def make_examples(api: httpx.Client, caller: Caller) -> Examples:
    """Run every fixture."""
    return Examples(
        parameters={name: fixture(api, caller) for name, fixture in FIXTURES.items()},
        schemas={name: fixture(api, caller) for name, fixture in SCHEMA_FIXTURES.items()},
    )
