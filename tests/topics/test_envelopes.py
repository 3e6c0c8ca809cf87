"""Envelope data is at most 64 KiB once decoded: over HTTP, through
``bothy.append_event``, and in both validators alike (the base64 text alone
cannot say it: 87,384 characters also spell 65,537 and 65,538 bytes)."""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
import pytest

from bothy_notify.store.events import EventRejected, EventValidator
from tests.harness import Launch, producer_token
from tests.topics.helpers import conversation, envelope

LIMIT = 65_536


def payload(size: int) -> dict[str, Any]:
    return envelope(conversation(), data=os.urandom(size))["payload"]


def sql_problem(conn: psycopg.Connection[Any], body: dict[str, Any]) -> str | None:
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(
                "SELECT bothy.append_event('envelope.published', %s::jsonb)", (json.dumps(body),)
            )
    except psycopg.errors.InvalidParameterValue as exc:
        return exc.diag.message_primary
    return None


def python_problem(body: dict[str, Any]) -> str | None:
    try:
        EventValidator().check("envelope.published", body)
    except EventRejected as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("size", [0, 1, 2, 3, LIMIT - 2, LIMIT - 1, LIMIT, LIMIT + 1, LIMIT + 2])
def test_both_validators_take_64_kib_and_refuse_a_byte_more(database_url: str, size: int) -> None:
    body = payload(size)
    with psycopg.connect(database_url) as conn:
        in_sql = sql_problem(conn, body)
    in_python = python_problem(body)
    if size <= LIMIT:
        assert (in_sql, in_python) == (None, None)
    else:
        assert in_sql == "bothy: payload.data: too long"
        assert in_python == "payload.data: too long"


def test_non_canonical_data_is_refused_for_its_form_not_its_size(database_url: str) -> None:
    body = payload(LIMIT)
    assert body["data"].endswith("==")
    body["data"] = body["data"][:-3] + "B=="  # stray bits in the last group
    with psycopg.connect(database_url) as conn:
        assert sql_problem(conn, body) == "bothy: payload.data: does not have the required form"
    assert python_problem(body) == "payload.data: does not have the required form"


async def test_an_envelope_over_64_kib_is_refused_over_http_and_nothing_is_kept(
    launch: Launch,
) -> None:
    node = await launch()
    answers = []
    for size in (LIMIT, LIMIT + 1, LIMIT + 2):
        answers.append(
            await node.http.post(
                f"{node.api}/v1/events",
                json={"events": [{"type": "envelope.published", "payload": payload(size)}]},
                headers={"authorization": f"Bearer {producer_token()}"},
            )
        )

    assert answers[0].status_code == 200
    for refused in answers[1:]:
        assert refused.status_code == 422
        assert refused.json()["error"]["message"] == "events[0].payload.data: too long"
    rows = await node.sql("SELECT count(*) FROM bothy.events WHERE type = 'envelope.published'")
    assert rows == [(1,)]
