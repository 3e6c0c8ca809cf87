"""Hostile HTTP input gets a constant answer and never a 500, and a slow client
cannot hold a request open: every case here also checks that another client is
served meanwhile (SPEC sections 9 and 14)."""

from __future__ import annotations

import trio

from tests.harness import Launch, Node, device_token, make_config
from tests.hostile.rawhttp import Answer, exchange, request_bytes, trickle
from tests.hostile.tokens import malformed_device_tokens, odd_scope_producer_tokens

UNAUTHORIZED = {"code": "unauthorized", "message": "the token is missing, invalid or expired"}
NO_BEARER = {"code": "unauthorized", "message": "a bearer token is required"}


async def still_serves(node: Node) -> None:
    """Another client gets its answer."""
    response = await node.request(
        "GET", "/v1/preferences", token=device_token("bystander", "bystander-phone")
    )
    assert response.status_code == 200


def preferences_with(authorization: list[bytes]) -> bytes:
    return request_bytes("GET", "/v1/preferences", [(b"Authorization", a) for a in authorization])


def api_address(node: Node) -> str:
    assert node.addresses.api is not None
    return node.addresses.api


async def test_every_malformed_device_token_is_401_with_the_constant_message(
    launch: Launch,
) -> None:
    node = await launch()
    for name, token in malformed_device_tokens():
        # Bytes as a client would send them; a lone surrogate becomes its
        # (invalid) UTF-8 encoding, which is all a token can be on the wire.
        value = b"Bearer " + token.encode("utf-8", "surrogatepass")
        answer = await exchange(api_address(node), preferences_with([value]))
        assert answer.status == 401, name
        assert answer.headers["www-authenticate"] == "Bearer", name
        assert answer.json() == {"error": NO_BEARER if not token else UNAUTHORIZED}, name
    await still_serves(node)
    assert await node.sql("SELECT count(*) FROM bothy.devices") == [(1,)]  # the bystander's


async def test_a_producer_token_with_an_odd_scope_is_403_forbidden(launch: Launch) -> None:
    node = await launch()
    for name, token in odd_scope_producer_tokens():
        response = await node.request("POST", "/v1/events", json={"events": []}, token=token)
        assert response.status_code == 403, name
        assert response.json() == {
            "error": {"code": "forbidden", "message": "the token lacks scope events:write"}
        }
    await still_serves(node)


async def test_every_malformed_authorization_header_is_401(launch: Launch) -> None:
    node = await launch()
    valid = device_token("mallory", "mallory-laptop").encode()
    cases: dict[str, list[bytes]] = {
        "empty": [b""],
        "scheme only": [b"Bearer"],
        "scheme and spaces": [b"Bearer    "],
        "basic": [b"Basic bWFsbG9yeTpwYXNz"],
        "another scheme": [b"Token " + valid],
        "no space": [b"Bearer" + valid],
        "tab instead of space": [b"Bearer\t" + valid],
        "comma": [b"Bearer," + valid],
        "two tokens": [b"Bearer " + valid + b" " + valid],
        "bytes that are not latin-1 text": [b"Bearer \x81\x8d\x8f\x90\x9d"],
        "UTF-8 after the token": [b"Bearer " + valid + "é".encode()],
        "UTF-8 scheme": ["Bëarer ".encode() + valid],
        "high bytes": [b"Bearer \xff\xfe\xfd"],
        "a control character": [b"Bearer \x01" + valid],
        "two headers": [b"Bearer " + valid, b"Bearer " + valid],
    }
    for name, headers in cases.items():
        answer = await exchange(api_address(node), preferences_with(headers))
        assert answer.status == 401, name
        assert answer.json()["error"]["code"] == "unauthorized", name
    assert await node.sql("SELECT count(*) FROM bothy.devices") == [(0,)]
    answer = await exchange(api_address(node), preferences_with([b"bearer   " + valid]))
    assert answer.status == 200  # the scheme is case-insensitive, spaces around the token ignored
    await still_serves(node)


async def test_a_header_the_http_server_cannot_parse_is_refused_before_the_app(
    launch: Launch,
) -> None:
    node = await launch()
    cases: dict[str, tuple[list[bytes], int]] = {
        "a NUL byte": ([b"Bearer abc\x00def"], 400),
        "a header block over 64 KiB": ([b"Bearer " + b"a" * 100_000], 431),
    }
    for name, (headers, status) in cases.items():
        answer = await exchange(api_address(node), preferences_with(headers))
        assert (answer.status, answer.body, answer.closed) == (status, b"", True), name
    await still_serves(node)


async def test_a_body_sent_a_byte_at_a_time_is_cut_off_with_408(launch: Launch) -> None:
    node = await launch(config=make_config(server={"body_timeout": "300ms"}))
    token = device_token("mallory", "mallory-laptop").encode()
    body = b'{"categories": {"admin": false}}' + b" " * 10_000
    data = request_bytes("PUT", "/v1/preferences", [(b"Authorization", b"Bearer " + token)], body)

    async with trio.open_nursery() as nursery:
        answers: list[Answer] = []

        async def slow_client() -> None:
            headers = data.index(b"\r\n\r\n") + 4
            answers.append(await trickle(api_address(node), data, pause=0.01, at_once=headers))

        nursery.start_soon(slow_client)
        await still_serves(node)  # while the slow client is still sending

    (answer,) = answers
    assert answer.status == 408
    assert answer.json() == {
        "error": {"code": "body_timeout", "message": "the request body did not arrive in time"}
    }
    assert answer.closed
    assert await node.sql("SELECT count(*) FROM bothy.preferences") == [(0,)]


async def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_timeout(
    launch: Launch,
) -> None:
    node = await launch(config=make_config(server={"header_timeout": "300ms"}))
    token = device_token("mallory", "mallory-laptop").encode()
    data = preferences_with([b"Bearer " + token])

    async with trio.open_nursery() as nursery:
        answers: list[Answer] = []

        async def slow_client() -> None:
            answers.append(await trickle(api_address(node), data, pause=0.01))

        nursery.start_soon(slow_client)
        await still_serves(node)

    assert answers == [Answer(None, {}, b"", True)]
