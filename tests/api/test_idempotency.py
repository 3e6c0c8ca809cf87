"""``POST /v1/events`` with an ``Idempotency-Key``: a retried batch is appended once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import trio

from bothy_notify.auth import mint_token
from tests.harness import TEST_KEY, Launch, Node, ev, make_config, producer_token

USER = ev("user.upserted", user_id="alex", kind="human", active=True)
OTHER_USER = ev("user.upserted", user_id="kim", kind="human", active=True)


async def post(
    node: Node, events: list[dict[str, Any]], key: str | None, token: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token or producer_token()}"}
    if key is not None:
        headers["idempotency-key"] = key
    return await node.http.post(f"{node.api}/v1/events", json={"events": events}, headers=headers)


async def event_count(node: Node) -> int:
    return int((await node.sql("SELECT count(*) FROM bothy.events"))[0][0])


async def test_a_retried_batch_answers_the_same_seqs_and_appends_nothing(launch: Launch) -> None:
    node = await launch()
    first = await post(node, [USER, OTHER_USER], "batch-0001")
    again = await post(node, [USER, OTHER_USER], "batch-0001")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and len(first.json()["seqs"]) == 2
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert await event_count(node) == 2


async def test_the_same_key_with_another_batch_is_a_conflict(launch: Launch) -> None:
    node = await launch()
    assert (await post(node, [USER], "batch-0002")).status_code == 200
    other = await post(node, [OTHER_USER], "batch-0002")
    assert other.status_code == 409
    assert other.json() == {
        "error": {
            "code": "idempotency_conflict",
            "message": "this Idempotency-Key was already used with a different batch",
        }
    }
    assert await event_count(node) == 1


async def test_the_batch_is_compared_as_json_not_as_bytes(launch: Launch) -> None:
    node = await launch()
    headers = {"authorization": f"Bearer {producer_token()}", "idempotency-key": "k1"}
    compact = b'{"events":[{"type":"user.upserted","payload":{"user_id":"alex","kind":"human","active":true}}]}'  # noqa: E501
    spaced = b'{ "events": [ { "payload": { "active": true, "kind": "human", "user_id": "alex" }, "type": "user.upserted" } ] }'  # noqa: E501
    first = await node.http.post(f"{node.api}/v1/events", content=compact, headers=headers)
    again = await node.http.post(f"{node.api}/v1/events", content=spaced, headers=headers)
    assert again.status_code == 200 and again.json() == first.json()
    assert await event_count(node) == 1


async def test_keys_belong_to_one_producer(launch: Launch) -> None:
    node = await launch()
    other_producer = mint_token(TEST_KEY, {"sub": "billing", "scope": "events:write"})
    mine = await post(node, [USER], "shared-key")
    theirs = await post(node, [USER], "shared-key", token=other_producer)
    assert theirs.status_code == 200 and theirs.json() != mine.json()
    assert await event_count(node) == 2


async def test_a_quoted_key_is_the_same_key(launch: Launch) -> None:
    node = await launch()
    bare = await post(node, [USER], "8e03978e-40d5-43e8-bc93-6894a57f9324")
    quoted = await post(node, [USER], '"8e03978e-40d5-43e8-bc93-6894a57f9324"')
    assert quoted.json() == bare.json() and await event_count(node) == 1


async def test_a_malformed_key_is_refused_and_nothing_is_appended(launch: Launch) -> None:
    node = await launch()
    for key in ("", "x" * 256, "has space", "semi;colon", '"unbalanced'):
        answer = await post(node, [USER], key)
        assert answer.status_code == 422, key
        assert answer.json()["error"] == {
            "code": "invalid",
            "message": "Idempotency-Key: does not have the required form",
        }
    assert (await post(node, [USER], "x" * 255)).status_code == 200
    assert await event_count(node) == 1


async def test_a_refused_batch_does_not_take_its_key(launch: Launch) -> None:
    node = await launch()
    bad = ev("user.upserted", user_id="alex", kind="robot", active=True)
    assert (await post(node, [bad], "batch-0003")).status_code == 422
    assert (await post(node, [USER], "batch-0003")).status_code == 200
    assert await event_count(node) == 1


async def test_concurrent_retries_append_once(launch: Launch) -> None:
    node = await launch()
    answers: list[httpx.Response] = []

    async def send() -> None:
        answers.append(await post(node, [USER, OTHER_USER], "batch-0004"))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(send)
    assert {a.status_code for a in answers} == {200}
    assert len({tuple(a.json()["seqs"]) for a in answers}) == 1
    assert await event_count(node) == 2


async def test_a_key_expires_after_the_window_and_housekeeping_prunes_it(launch: Launch) -> None:
    node = await launch(config=make_config(server={"idempotency_window": "1h"}))
    first = await post(node, [USER], "batch-0005")
    node.clock.advance(timedelta(minutes=59))
    assert (await post(node, [USER], "batch-0005")).json() == first.json()
    node.clock.advance(timedelta(minutes=2))
    later = await post(node, [OTHER_USER], "batch-0005")  # free again, even for another batch
    assert later.status_code == 200 and later.json() != first.json()
    assert await event_count(node) == 2

    await post(node, [USER], "batch-0006")
    node.clock.advance(timedelta(minutes=61))
    housekeeper = node.daemon.housekeeper
    assert housekeeper is not None
    assert (await housekeeper.sweep_now()).append_keys_pruned == 2
    assert await node.sql("SELECT count(*) FROM bothy.append_keys") == [(0,)]
