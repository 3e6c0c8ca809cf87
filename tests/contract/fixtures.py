"""Fixtures of the contract run: data it needs that the API's own operations cannot make.

One fixture per resource, keyed by the name of the path parameter whose values
it makes (``thread_id``). It runs once before the run against the daemon's
HTTP API, and its values become that parameter's ``examples`` in the document
the run reads. Resources the API itself makes (registrations, recipients,
subscriptions) need no fixture: the document's ``links`` make them in the
stateful phase. A new operation whose path parameter is neither linked to nor
fixtured never reaches a 2xx, and the contract test names it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from tests.contract.harness import fresh_name


@dataclass(frozen=True)
class Caller:
    """Who the run acts as: the person of its device token, and the producer."""

    user_id: str
    device_token: str
    producer_token: str


Fixture = Callable[[httpx.Client, Caller], list[str]]


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
    deadline = time.monotonic() + 20
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


FIXTURES: Mapping[str, Fixture] = {"thread_id": readable_threads}
"""Per path parameter name, the fixture that makes values for it."""


def make_examples(api: httpx.Client, caller: Caller) -> dict[str, list[str]]:
    """Run every fixture; the values per path parameter name."""
    return {name: fixture(api, caller) for name, fixture in FIXTURES.items()}
