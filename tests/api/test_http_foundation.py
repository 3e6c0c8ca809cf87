"""The HTTP API of the foundation: events, registrations, read positions, operator
endpoints, and how each refuses bad input."""

from __future__ import annotations

import base64

import pytest

from bothy_notify.auth import mint_token
from tests.harness import TEST_KEY, Launch, device_token, ev, make_config, producer_token

PHONE = device_token("alex", "phone")


def message(seq: int = 1) -> dict:
    return ev(
        "message.created", thread_id="t1", message_id=f"m{seq}", thread_seq=seq, author_id="sam"
    )


async def test_events_append_in_order_and_answer_their_seqs(launch: Launch) -> None:
    node = await launch()
    seqs = await node.append(ev("member.added", user_id="a", scope_id="s"), message())
    assert len(seqs) == 2 and seqs[0] < seqs[1]
    rows = await node.sql("SELECT seq, type FROM bothy.events ORDER BY seq")
    assert rows == [(seqs[0], "member.added"), (seqs[1], "message.created")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"events": [message(), ev("thread.read", user_id="a", thread_id="t")]},
            "events[1].payload.seq: required",
        ),
        (
            {
                "events": [
                    ev(
                        "message.created",
                        thread_id="t",
                        message_id="m",
                        thread_seq=0,
                        author_id="a",
                    )
                ]
            },
            "events[0].payload.thread_seq: too small",
        ),
        ({"events": [{"type": "nope", "payload": {}}]}, "events[0].type: unknown event type"),
        ({"events": [{"type": "member.added"}]}, "events[0].payload: required"),
        ({"events": []}, "events: too few items"),
        ({"events": {}}, "events: expected an array"),
        ({"rows": []}, "(body): unknown field"),
        ([1, 2], "(body): expected an object"),
        (
            {"events": [ev("user.upserted", user_id="a" * 129, kind="human", active=True)]},
            "events[0].payload.user_id: does not have the required form",
        ),
    ],
)
async def test_invalid_events_get_422_naming_the_field_and_nothing_is_kept(
    launch: Launch, body: object, message: str
) -> None:
    node = await launch()
    response = await node.request("POST", "/v1/events", json=body, token=producer_token())
    assert response.status_code == 422
    assert response.json() == {"error": {"code": "invalid", "message": message}}
    assert await node.sql("SELECT count(*) FROM bothy.events") == [(0,)]


async def test_events_refuse_malformed_json_oversized_batches_and_bodies(launch: Launch) -> None:
    node = await launch(config=make_config(server={"max_batch_events": 2, "max_body_bytes": 2048}))
    bad = await node.request("POST", "/v1/events", content=b"{nope", token=producer_token())
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "bad_json")
    many = await node.request(
        "POST",
        "/v1/events",
        json={"events": [message(i) for i in (1, 2, 3)]},
        token=producer_token(),
    )
    assert (many.status_code, many.json()["error"]) == (
        422,
        {"code": "invalid", "message": "events: too many items (server.max_batch_events)"},
    )
    big = await node.request(
        "POST", "/v1/events", content=b"{" + b" " * 4000 + b"}", token=producer_token()
    )
    assert big.status_code == 413


async def test_events_need_a_producer_token_with_scope_events_write(launch: Launch) -> None:
    node = await launch()
    body = {"events": [message()]}
    missing = await node.request("POST", "/v1/events", json=body)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    forged = mint_token(
        "another-key-entirely-0123456789-abcdef", {"sub": "x", "scope": "events:write"}
    )
    assert (await node.request("POST", "/v1/events", json=body, token=forged)).status_code == 401
    expired = mint_token(TEST_KEY, {"sub": "x", "scope": "events:write", "exp": 1000})
    assert (await node.request("POST", "/v1/events", json=body, token=expired)).status_code == 401
    wrong = await node.request("POST", "/v1/events", json=body, token=producer_token("events:read"))
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "forbidden"
    assert await node.sql("SELECT count(*) FROM bothy.events") == [(0,)]


async def test_registration_upsert_is_idempotent(launch: Launch) -> None:
    node = await launch()
    first = await node.request(
        "POST", "/v1/registrations", token=PHONE, json={"provider": "fake", "token": "tok-1"}
    )
    assert first.status_code == 201
    body = first.json()
    assert set(body) == {"id", "provider", "state", "created_at"}
    assert body["state"] == "active"
    again = await node.request(
        "POST", "/v1/registrations", token=PHONE, json={"provider": "fake", "token": "tok-1"}
    )
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    listed = await node.request("GET", "/v1/registrations", token=PHONE)
    assert [r["id"] for r in listed.json()["registrations"]] == [body["id"]]


async def test_registrations_are_listed_and_deleted_only_for_their_owner(launch: Launch) -> None:
    node = await launch()
    mine = await node.register("alex", "phone", "tok-a")
    await node.register("sam", "sams-phone", "tok-s")
    sams = device_token("sam", "sams-phone")
    assert (
        await node.request("DELETE", f"/v1/registrations/{mine['id']}", token=sams)
    ).status_code == 204
    assert (
        len((await node.request("GET", "/v1/registrations", token=PHONE)).json()["registrations"])
        == 1
    )
    assert (
        await node.request("DELETE", f"/v1/registrations/{mine['id']}", token=PHONE)
    ).status_code == 204
    assert (
        await node.request("DELETE", f"/v1/registrations/{mine['id']}", token=PHONE)
    ).status_code == 204
    assert (await node.request("GET", "/v1/registrations", token=PHONE)).json() == {
        "registrations": []
    }


async def test_registration_creates_the_device_and_a_revoked_device_is_refused(
    launch: Launch,
) -> None:
    node = await launch()
    await node.register("alex", "phone", "tok-a", platform="ios")
    assert await node.sql("SELECT user_id, platform, state FROM bothy.devices") == [
        ("alex", "ios", "active")
    ]
    await node.append(
        ev("device.upserted", device_id="phone", user_id="alex", platform="ios", state="revoked")
    )
    await node.settle()
    refused = await node.request(
        "POST", "/v1/registrations", token=PHONE, json={"provider": "fake", "token": "tok-b"}
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "device_revoked"
    listed = await node.sql("SELECT invalidated_at IS NOT NULL FROM bothy.push_registrations")
    assert listed == [(True,)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"token": "x"}, "provider: required"),
        ({"provider": "apns", "token": "x"}, "provider: not a configured provider"),
        ({"provider": "fake"}, "token: required"),
        ({"provider": "fake", "token": ""}, "token: expected a non-empty string"),
        (
            {"provider": "fake", "token": "x", "environment": "staging"},
            "environment: expected sandbox or production",
        ),
        ({"provider": "fake", "token": "x", "colour": "red"}, "colour: unknown field"),
        (
            {"provider": "fake", "token": "x", "signing_key": base64.b64encode(b"k" * 32).decode()},
            "signing_key: only webhook registrations take it",
        ),
    ],
)
async def test_bad_registrations_get_422_naming_the_field(
    launch: Launch, body: dict, message: str
) -> None:
    node = await launch()
    response = await node.request("POST", "/v1/registrations", json=body, token=PHONE)
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(message)
    assert "x" not in response.json()["error"]["message"].split(": ", 1)[1].split()


async def test_device_endpoints_refuse_missing_and_incomplete_tokens(launch: Launch) -> None:
    node = await launch()
    assert (await node.request("GET", "/v1/registrations")).status_code == 401
    no_device = mint_token(TEST_KEY, {"sub": "alex", "plat": "ios"})
    assert (await node.request("GET", "/v1/registrations", token=no_device)).status_code == 401
    producer = producer_token()
    assert (await node.request("GET", "/v1/registrations", token=producer)).status_code == 401


async def test_read_position_only_moves_forward(launch: Launch) -> None:
    node = await launch()
    await node.append(
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
    )
    await node.settle()
    put = await node.request("PUT", "/v1/threads/t1/read", json={"seq": 7}, token=PHONE)
    assert put.json() == {"thread_id": "t1", "last_read_seq": 7}
    back = await node.request("PUT", "/v1/threads/t1/read", json={"seq": 3}, token=PHONE)
    assert back.json() == {"thread_id": "t1", "last_read_seq": 7}
    bad = await node.request("PUT", "/v1/threads/t1/read", json={"seq": -1}, token=PHONE)
    assert bad.status_code == 422 and bad.json()["error"]["message"].startswith("seq:")
    bad_id = await node.request(
        "PUT", "/v1/threads/not%20an%20id/read", json={"seq": 1}, token=PHONE
    )
    assert bad_id.status_code == 404  # a path id of another form names no thread


async def test_operator_endpoints(launch: Launch) -> None:
    node = await launch()
    assert (await node.request("GET", "/healthz")).json() == {"status": "ok"}
    ready = await node.request("GET", "/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "database": True,
        "round": True,
        "runner": True,
        "housekeeper": True,
    }
    await node.append(message())
    await node.settle()
    metrics = (await node.request("GET", "/metrics")).text
    for name in (
        "bothy_push_skipped_total",
        "bothy_consumer_holder 1.0",
        "bothy_consumer_lag_events",
        "bothy_jobs_lag_seconds",
        'bothy_push_skipped_total{reason="no_access"}',
    ):
        assert name in metrics
    unknown = await node.request("GET", "/v1/nothing-here")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


async def test_worker_role_serves_only_operator_endpoints(launch: Launch) -> None:
    node = await launch(config=make_config(server={"role": "worker"}))
    assert (await node.request("GET", "/healthz")).status_code == 200
    assert (await node.request("GET", "/v1/registrations", token=PHONE)).status_code == 404
