"""Error answers: one shape, constant messages that echo nothing, and the right
status for each kind of bad request on every endpoint that takes a body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tests.harness import Launch, Node, device_token, ev, make_config, producer_token

DEVICE = device_token("alex", "alex-phone")
PRODUCER = producer_token()

BODY_ENDPOINTS = [
    ("PUT", "/v1/preferences", DEVICE),
    ("PUT", "/v1/threads/t1/follow", DEVICE),
    ("PUT", "/v1/threads/t1/read", DEVICE),
    ("POST", "/v1/registrations", DEVICE),
    ("POST", "/v1/events", PRODUCER),
]


def error_of(response: Any) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    error: dict[str, str] = body["error"]
    return error


MALFORMED = {
    "syntax": b"{not json",
    "nan": b'{"seq": NaN}',
    "member-twice": b'{"seq": 1, "seq": 2}',
    "infinite": b'{"seq": 1e999}',
    "deep": b"[" * 100_000,
    "not-utf8": b"\xff\xfe",
    "empty": b"",
}


async def test_malformed_json_is_400_on_every_endpoint_with_a_body(launch: Launch) -> None:
    node = await launch(config=make_config(server={"max_body_bytes": 200_000}))
    for method, path, token in BODY_ENDPOINTS:
        for name, raw in MALFORMED.items():
            response = await node.request(
                method, path, token=token, content=raw, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400, (method, path, name)
            assert error_of(response) == {
                "code": "bad_json",
                "message": "the body is not valid JSON",
            }


async def chunks(total: int) -> AsyncIterator[bytes]:
    """A body without Content-Length (chunked), so only counting can stop it."""
    sent = 0
    while sent < total:
        yield b" " * 256
        sent += 256


async def test_a_body_over_max_body_bytes_is_413_declared_or_streamed(launch: Launch) -> None:
    node = await launch(config=make_config(server={"max_body_bytes": 1024}))
    for method, path, token in BODY_ENDPOINTS:
        declared = await node.request(method, path, token=token, content=b" " * 2048)
        streamed = await node.request(method, path, token=token, content=chunks(4096))
        for response in (declared, streamed):
            assert response.status_code == 413, (method, path)
            assert error_of(response)["code"] == "too_large"


async def test_a_body_that_is_not_an_object_is_422(launch: Launch) -> None:
    node = await launch()
    for method, path, token in BODY_ENDPOINTS:
        response = await node.request(method, path, token=token, json=[1, 2])
        assert response.status_code == 422, (method, path)
        assert error_of(response) == {"code": "invalid", "message": "(body): expected an object"}


async def refusals(node: Node, marker: str) -> list[Any]:
    """Error answers to requests that carry ``marker`` in IDs, tokens and URLs."""
    token = device_token(marker, marker)
    return [
        await node.request(
            "PUT", f"/v1/threads/{marker}!/follow", json={"level": "all"}, token=token
        ),
        await node.request("PUT", f"/v1/threads/{marker}/read", json={"seq": marker}, token=token),
        await node.request(
            "PUT", "/v1/preferences", json={"categories": {marker: True}}, token=token
        ),
        await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "fake", "token": f"{marker} x"},
            token=token,
        ),
        await node.request(
            "POST",
            "/v1/registrations",
            json={"provider": "webhook", "token": f"https://{marker}.example/"},
            token=token,
        ),
        await node.request(
            "POST",
            "/v1/events",
            token=PRODUCER,
            json={"events": [ev("member.added", user_id=f"{marker}!", scope_id=marker)]},
        ),
        await node.request(
            "POST",
            "/v1/events",
            token=token,
            json={"events": [ev("member.added", user_id=marker, scope_id="s")]},
        ),
        await node.request("GET", "/v1/preferences", token=token + "x"),
        await node.request("GET", f"/v1/{marker}", token=token),
    ]


async def test_error_messages_echo_no_token_id_or_url(launch: Launch) -> None:
    node = await launch()
    marker = "Zq7MarkerIdW"
    answers = await refusals(node, marker)
    assert [r.status_code for r in answers] == [404, 422, 422, 422, 422, 422, 403, 401, 404]
    for response in answers:
        error_of(response)
        assert marker not in response.text
        assert "example" not in response.text
        assert "eyJ" not in response.text  # no JWT, not even a piece of one


async def test_an_unknown_path_is_404_and_a_wrong_method_405_listing_the_allowed_ones(
    launch: Launch,
) -> None:
    node = await launch()
    missing = await node.request("GET", "/v1/nothing-here")
    assert missing.status_code == 404
    assert error_of(missing) == {"code": "not_found", "message": "no such endpoint"}

    wrong = await node.request("DELETE", "/v1/preferences", token=DEVICE)
    assert wrong.status_code == 405
    assert error_of(wrong) == {"code": "method_not_allowed", "message": "method not allowed"}
    assert {m.strip() for m in wrong.headers["allow"].split(",")} == {"GET", "HEAD", "PUT"}
