"""A path id of any form never gives a 5xx (issue 24, item 1; SPEC section 14).

Every route whose path names a parameter, taken from the app's own route table
(a route added later is covered without touching this test), is called over a
real socket with ids of every bad form: NUL, invalid UTF-8, 5,000 characters,
an emoji, ``../``, a space, a lone ``%``. With a valid token the answer is 404
(204 for a DELETE); without one it is 401; never a 5xx, and nothing in the
database changes (not even the caller's device row, which a request that
reaches its handler creates).
"""

from __future__ import annotations

import re

import pytest
from starlette.requests import Request
from starlette.responses import Response

from bothy_notify.api.app import PATH_PARAMETERS
from bothy_notify.api.context import ApiContext
from tests.harness import Launch, Node, device_token
from tests.hostile.rawhttp import exchange, request_bytes
from tests.support.offline import offline_app

BAD_IDS = {
    "NUL": "%00",
    "NUL inside": "a%00b",
    "invalid UTF-8": "%ff",
    "invalid UTF-8 inside": "t%C3%28x",
    "5,000 characters": "a" * 5000,
    "emoji": "%F0%9F%98%80",
    "dot dot slash": "..%2F",
    "dot dot slash twice": "..%2F..%2Fhealthz",
    "space": "a%20b",
    "lone percent": "%",
    "129 characters": "b" * 129,
    "control character": "%07",
}
"""Path ids of the forms SPEC names, as they appear in the request line."""

_PARAMETER = re.compile(r"\{([a-z_]+)(?::[a-z]+)?\}")


def routes_with_path_parameters() -> list[tuple[str, str]]:
    """(path template, method) of every served route that names a path parameter."""
    found: list[tuple[str, str]] = []
    for route in offline_app().routes:
        path = getattr(route, "path", "")
        if _PARAMETER.search(path):
            # Starlette serves HEAD for every GET through the same endpoint: GET covers it.
            methods = sorted(set(getattr(route, "methods", ())) - {"HEAD"})
            found.extend((path, method) for method in methods)
    return found


ROUTES = routes_with_path_parameters()


def test_the_table_covers_the_routes_with_path_parameters() -> None:
    assert {p for p, _ in ROUTES} >= {
        "/v1/registrations/{registration_id}",
        "/v1/threads/{thread_id}/read",
        "/v1/threads/{thread_id}/follow",
    }
    for path, _method in ROUTES:
        assert set(_PARAMETER.findall(path)) <= set(PATH_PARAMETERS)


def test_a_route_naming_a_parameter_without_a_form_is_refused_when_built() -> None:
    async def handler(ctx: ApiContext, request: Request) -> Response:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="widget_id"):
        offline_app(extra_routes=[("/v1/widgets/{widget_id}", handler, ["GET"])])


def _target(path: str, value: str) -> str:
    return _PARAMETER.sub(value, path)


async def _snapshot(node: Node) -> dict[str, list[str]]:
    """Every row of every table of schema ``bothy``, as text."""
    tables = [
        row[0]
        for row in await node.sql(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'bothy' AND table_type = 'BASE TABLE' ORDER BY 1"
        )
    ]
    out: dict[str, list[str]] = {}
    for table in tables:
        rows = await node.sql(f"SELECT t::text FROM bothy.{table} t ORDER BY 1")
        out[table] = [r[0] for r in rows]
    return out


async def test_every_bad_path_id_is_404_or_204_and_stores_nothing(launch: Launch) -> None:
    node = await launch()
    assert node.addresses.api is not None
    token = device_token("alex", "alex-phone").encode()
    before = await _snapshot(node)
    for path, method in ROUTES:
        body = b'{"seq": 1}' if "/read" in path else b'{"level": "all"}' if method == "PUT" else b""
        for name, value in BAD_IDS.items():
            target = _target(path, value)
            headers = [(b"Content-Type", b"application/json")]
            with_token = await exchange(
                node.addresses.api,
                request_bytes(
                    method, target, [(b"Authorization", b"Bearer " + token), *headers], body
                ),
            )
            without = await exchange(
                node.addresses.api, request_bytes(method, target, headers, body)
            )
            where = (method, path, name)
            assert with_token.status is not None and with_token.status < 500, (where, with_token)
            assert without.status is not None and without.status < 500, (where, without)
            if "%2F" not in value:
                expected = 204 if method == "DELETE" else 404
                assert with_token.status == expected, (where, with_token.status, with_token.body)
                assert without.status == 401, (where, without.status)
                if expected == 404:  # the answer of a thread that does not exist
                    assert with_token.json()["error"]["code"] == "not_found", where
            else:
                # A '/' in the id leaves the route: the router's own 404, or its redirect
                # of a path ending in '/' to the one without (``..%2F``: to ``..``).
                assert with_token.status in (307, 404), (where, with_token.status)
    assert await _snapshot(node) == before
    # The snapshot sees what a request that reaches a handler stores: the device row.
    answer = await node.request("GET", "/v1/preferences", token=token.decode())
    assert answer.status_code == 200
    assert await _snapshot(node) != before
