"""A number with a zero fractional part is an integer wherever one is asked for.

JSON Schema counts ``8487.0`` as the integer 8487, and the served OpenAPI
document says integer: so every place that asks for an integer accepts it, and
what is stored and answered is the integer (``8487``, never ``8487.0``); a
number with a fraction (``8487.5``) is refused as before. The places: the
parser every HTTP body and gateway frame goes through, ``PUT
/v1/threads/{id}/read``, event payloads over HTTP (the Python validator) and
through ``bothy.append_event`` itself (the SQL validator, the outbox path),
topic mode's ``hmac_epoch_base``, and the gateway's ``read`` op.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio

from bothy_notify.kernel import strict_json
from tests.gateway.client import connect_live
from tests.gateway.world import start as start_gateway_world
from tests.harness import Launch, Node, device_token, ev, producer_token
from tests.topics.helpers import Recipient, add, conversation, hmac_key, register

PHONE = device_token("alex", "alex-phone")


async def _send(node: Node, method: str, path: str, text: str, token: str) -> Any:
    """``text`` as the body, exactly (httpx's ``json=`` would write 8487.0 as it likes)."""
    return await node.request(
        method,
        path,
        content=text.encode(),
        headers={"content-type": "application/json"},
        token=token,
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8487.0", 8487),
        ("8487.000", 8487),
        ("-0.0", 0),
        ("1e3", 1000),
        ("8.487E3", 8487),
        ("9007199254740993.0", 9007199254740993),
        ("8487.5", 8487.5),
        ("1e-3", 0.001),
    ],
)
def test_the_parser_reads_an_integral_number_as_an_int(text: str, value: float) -> None:
    parsed = strict_json.loads(f'{{"n": {text}}}')["n"]
    assert parsed == value and type(parsed) is type(value)


async def _readable_thread(node: Node) -> None:
    await node.append(
        ev("user.upserted", user_id="alex", kind="human", active=True),
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
    )
    await node.settle()


async def test_put_read_takes_8487_0_stores_and_answers_8487(launch: Launch) -> None:
    node = await launch()
    await _readable_thread(node)
    put = await _send(node, "PUT", "/v1/threads/t1/read", '{"seq": 8487.0}', PHONE)
    assert put.status_code == 200
    assert put.text == '{"thread_id":"t1","last_read_seq":8487}'
    assert await node.sql("SELECT last_read_seq FROM bothy.read_states") == [(8487,)]

    half = await _send(node, "PUT", "/v1/threads/t1/read", '{"seq": 8488.5}', PHONE)
    assert half.status_code == 422
    assert half.json()["error"]["message"] == "seq: expected an integer from 0"


async def _post_events(node: Node, text: str) -> Any:
    return await _send(node, "POST", "/v1/events", text, producer_token())


async def test_event_payloads_over_http_store_the_integer(launch: Launch) -> None:
    node = await launch()
    appended = await _post_events(
        node,
        '{"events": [{"type": "thread.read", "payload":'
        ' {"user_id": "alex", "thread_id": "t1", "seq": 5.0}},'
        ' {"type": "message.created", "payload": {"thread_id": "t1", "message_id": "m.1",'
        ' "thread_seq": 3.00, "author_id": "sam", "mentions": []}}]}',
    )
    assert appended.status_code == 200, appended.text
    stored = await node.sql("SELECT payload::text FROM bothy.events ORDER BY seq")
    assert [json.loads(r[0]).get("seq", json.loads(r[0]).get("thread_seq")) for r in stored] == [
        5,
        3,
    ]
    assert all(".0" not in r[0] for r in stored)

    refused = await _post_events(
        node,
        '{"events": [{"type": "thread.read", "payload":'
        ' {"user_id": "alex", "thread_id": "t1", "seq": 5.5}}]}',
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["message"] == "events[0].payload.seq: expected an integer"
    await node.settle()
    assert await node.sql("SELECT count(*) FROM bothy.events") == [(2,)]


def _append(conn: psycopg.Connection[Any], type_: str, payload: str) -> str:
    """Append through ``bothy.append_event``; the stored payload's text, or the refusal."""
    try:
        with conn.transaction(force_rollback=True):
            (seq,) = conn.execute(
                "SELECT bothy.append_event(%s, %s::jsonb)", (type_, payload)
            ).fetchone() or (None,)
            (stored,) = conn.execute(
                "SELECT payload::text FROM bothy.events WHERE seq = %s", (seq,)
            ).fetchone() or (None,)
            return str(stored)
    except psycopg.errors.InvalidParameterValue as exc:
        return f"refused: {exc.diag.message_primary}"


def test_append_event_in_sql_stores_the_integer(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        read = _append(
            conn, "thread.read", '{"user_id": "a.b", "thread_id": "t.1", "seq": 8487.000}'
        )
        assert json.loads(read) == {"user_id": "a.b", "thread_id": "t.1", "seq": 8487}
        assert "8487.0" not in read
        floor = _append(conn, "thread.upserted", '{"thread_id": "t1", "unread_floor_seq": 4.2e1}')
        assert json.loads(floor) == {"thread_id": "t1", "unread_floor_seq": 42}
        untouched = '{"user_id": "a.b", "thread_id": "t.1", "seq": 12}'
        assert json.loads(_append(conn, "thread.read", untouched)) == json.loads(untouched)
        refused = _append(conn, "thread.read", '{"user_id": "a", "thread_id": "t", "seq": 1.5}')
        assert refused == "refused: bothy: payload.seq: expected an integer"


async def test_hmac_epoch_base_of_7_0_is_the_integer_7(launch: Launch) -> None:
    node = await launch()
    who = Recipient()
    assert (await register(node, who)).status_code == 200
    body = {**who.identity(), "adds": [add(conversation(), keys=[hmac_key()], base=7)]}
    text = json.dumps(body).replace('"hmac_epoch_base": 7', '"hmac_epoch_base": {}')

    async def subscriptions(base: str) -> Any:
        body = text.replace("{}", base)
        return await _send(node, "POST", "/v1/recipients/subscriptions", body, PHONE)

    accepted = await subscriptions("7.0")
    assert accepted.status_code == 200, accepted.text
    assert await node.sql("SELECT hmac_epoch_base FROM bothy.topic_subscriptions") == [(7,)]
    half = await subscriptions("7.5")
    assert half.status_code == 400
    assert half.json()["error"] == {"code": "invalid_argument", "message": "request is malformed"}


async def test_the_gateway_read_op_takes_4_0_and_answers_4(
    launch: Launch, nursery: trio.Nursery
) -> None:
    node = await start_gateway_world(launch)
    client = await connect_live(nursery, node, "sam", "sam-desktop")
    mark = len(client.frames)
    await client.send_raw('{"op": "read", "d": {"thread_id": "t1", "seq": 4.0}}')
    ack = await client.wait_op("read.ack", after=mark)
    assert ack == {"op": "read.ack", "d": {"thread_id": "t1", "last_read_seq": 4}}
    await client.send_raw('{"op": "read", "d": {"thread_id": "t1", "seq": 4.5}}')
    assert await client.wait_closed() == (4003, "invalid read")
