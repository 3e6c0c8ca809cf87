"""JWT verification over real HTTP: key types and sources, ``exp``, ``nbf``,
issuer, audience, leeway, acting only for one's own ``sub``, and the producer
scope ``events:write``."""

from __future__ import annotations

import copy
import time
from typing import Any

import jwt
import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bothy_notify.auth import mint_token
from bothy_notify.config import Config, structure_config
from bothy_notify.store import secrets
from tests.harness import BASE, TEST_KEY, Launch, Node, device_token, ev, producer_token

HS_SECRET = "another-hs256-secret-for-tests-0123456789"
OTHER_KEY = "a-key-nobody-configured-0123456789abcdef"
DEVICE_CLAIMS = {"sub": "alex", "did": "alex-phone", "plat": "ios", "kind": "user"}


def config_with(auth: dict[str, Any], env: dict[str, str] | None = None) -> Config:
    raw = copy.deepcopy(BASE)
    raw["auth"] = auth
    return structure_config(raw, env=env or {})


def pem_pair(algorithm: str) -> tuple[str, str]:
    """(private PEM for signing, public PEM for the configuration)."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        private = ec.generate_private_key(ec.SECP256R1())
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


async def status(node: Node, token: str | None) -> int:
    """The status of a device call (``GET /v1/preferences``) with ``token``."""
    return (await node.request("GET", "/v1/preferences", token=token)).status_code


def signed(key: str, claims: dict[str, Any], algorithm: str = "HS256", **extra: Any) -> str:
    return jwt.encode({**claims, **extra}, key, algorithm=algorithm)


def later(seconds: int) -> int:
    return int(time.time()) + seconds


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
async def test_rs256_and_es256_public_keys_in_pem_verify_device_tokens(
    launch: Launch, algorithm: str
) -> None:
    private_pem, public_pem = pem_pair(algorithm)
    node = await launch(config=config_with({"keys": [{"algorithm": algorithm, "key": public_pem}]}))
    good = mint_token(private_pem, DEVICE_CLAIMS, algorithm=algorithm)
    other_private, _ = pem_pair(algorithm)
    forged = mint_token(other_private, DEVICE_CLAIMS, algorithm=algorithm)
    assert await status(node, good) == 200
    assert await status(node, forged) == 401
    # An HS256 token is refused when no HS256 key is configured.
    assert await status(node, device_token("alex", "alex-phone")) == 401


async def test_keys_come_from_the_environment_and_from_the_secret_store(
    launch: Launch, database_url: str
) -> None:
    private_pem, public_pem = pem_pair("ES256")
    with psycopg.connect(database_url) as conn:
        secrets.put(conn, "jwt-hs", HS_SECRET)
    config = config_with(
        {
            "keys": [
                {"algorithm": "HS256", "key": "secret:jwt-hs"},
                {"algorithm": "ES256", "key": "env:BOTHY_TEST_ES256"},
            ]
        },
        env={"BOTHY_TEST_ES256": public_pem},
    )
    node = await launch(config=config)
    assert await status(node, mint_token(HS_SECRET, DEVICE_CLAIMS)) == 200
    assert await status(node, mint_token(private_pem, DEVICE_CLAIMS, algorithm="ES256")) == 200
    assert await status(node, mint_token(TEST_KEY, DEVICE_CLAIMS)) == 401


async def test_expiry_is_required_and_checked_with_the_configured_leeway(launch: Launch) -> None:
    node = await launch(
        config=config_with({"keys": [{"algorithm": "HS256", "key": TEST_KEY}], "leeway": "30s"})
    )
    assert await status(node, signed(TEST_KEY, DEVICE_CLAIMS)) == 401  # no exp at all
    assert await status(node, signed(TEST_KEY, DEVICE_CLAIMS, exp=later(-10))) == 200
    assert await status(node, signed(TEST_KEY, DEVICE_CLAIMS, exp=later(-120))) == 401


async def test_not_before_is_honoured_with_the_configured_leeway(launch: Launch) -> None:
    node = await launch(
        config=config_with({"keys": [{"algorithm": "HS256", "key": TEST_KEY}], "leeway": "30s"})
    )
    soon = signed(TEST_KEY, DEVICE_CLAIMS, exp=later(600), nbf=later(10))
    future = signed(TEST_KEY, DEVICE_CLAIMS, exp=later(600), nbf=later(300))
    assert await status(node, soon) == 200
    assert await status(node, future) == 401


async def test_issuer_and_audience_are_enforced_when_configured(launch: Launch) -> None:
    node = await launch(
        config=config_with(
            {
                "keys": [{"algorithm": "HS256", "key": TEST_KEY}],
                "issuer": "https://id.example.com",
                "audience": "bothy",
            }
        )
    )

    def token(**claims: Any) -> str:
        return signed(TEST_KEY, DEVICE_CLAIMS, exp=later(600), **claims)

    assert await status(node, token(iss="https://id.example.com", aud="bothy")) == 200
    assert await status(node, token(iss="https://id.example.com", aud=["other", "bothy"])) == 200
    assert await status(node, token(iss="https://evil.example.com", aud="bothy")) == 401
    assert await status(node, token(aud="bothy")) == 401
    assert await status(node, token(iss="https://id.example.com", aud="other")) == 401
    assert await status(node, token(iss="https://id.example.com")) == 401


async def test_issuer_and_audience_are_not_checked_when_not_configured(launch: Launch) -> None:
    node = await launch()
    token = signed(TEST_KEY, DEVICE_CLAIMS, exp=later(600), iss="anyone", aud="anything")
    assert await status(node, token) == 200


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Basic YWxleDpzZWNyZXQ=",
        "Bearer not-a-jwt",
        "Bearer " + jwt.encode({**DEVICE_CLAIMS, "exp": later(600)}, None, algorithm="none"),  # type: ignore[arg-type]
        "Bearer " + mint_token(OTHER_KEY, DEVICE_CLAIMS),
        "Bearer " + mint_token(TEST_KEY, {**DEVICE_CLAIMS, "sub": "not an id"}),
        "Bearer " + mint_token(TEST_KEY, {**DEVICE_CLAIMS, "plat": "amiga"}),
        "Bearer " + mint_token(TEST_KEY, {"sub": "alex", "plat": "ios"}),
    ],
    ids=[
        "missing",
        "no-token",
        "basic",
        "garbage",
        "alg-none",
        "wrong-key",
        "bad-sub",
        "bad-plat",
        "no-did",
    ],
)
async def test_a_bad_device_token_is_401_with_a_constant_message(
    launch: Launch, authorization: str | None
) -> None:
    node = await launch()
    headers = {"authorization": authorization} if authorization else {}
    response = await node.request("GET", "/v1/preferences", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthorized"
    credential = (authorization or "").partition(" ")[2]
    if credential:
        assert credential not in response.text


async def test_a_producer_token_needs_scope_events_write(launch: Launch) -> None:
    node = await launch()
    batch = {"events": [ev("member.added", user_id="alex", scope_id="s1")]}

    async def post(token: str | None) -> int:
        response = await node.request("POST", "/v1/events", json=batch, token=token)
        return response.status_code

    assert await post(producer_token("events:write")) == 200
    assert await post(producer_token("profile events:write metrics:read")) == 200
    assert await post(producer_token("events:read")) == 403
    assert await post(producer_token("")) == 403
    assert await post(device_token("alex", "alex-phone")) == 403
    assert await post(None) == 401
    assert await post(mint_token(OTHER_KEY, {"scope": "events:write"})) == 401
    assert await node.sql("SELECT count(*) FROM bothy.events") == [(2,)]


async def test_a_device_token_acts_only_for_its_own_sub(launch: Launch) -> None:
    node = await launch()
    await node.append(
        ev("thread.upserted", thread_id="t1", space_id="s1"),
        ev("member.added", user_id="alex", scope_id="s1"),
        ev("member.added", user_id="sam", scope_id="s1"),
    )
    await node.settle()
    alex = device_token("alex", "alex-phone")
    sam = device_token("sam", "sam-phone")
    registration = await node.register("alex", "alex-phone", "alex-token")
    await node.request("PUT", "/v1/preferences", json={"categories": {"admin": False}}, token=alex)
    await node.request("PUT", "/v1/threads/t1/follow", json={"level": "none"}, token=alex)
    await node.request("PUT", "/v1/threads/t1/read", json={"seq": 5}, token=alex)

    listed = await node.request("GET", "/v1/registrations", token=sam)
    assert listed.json() == {"registrations": []}
    gone = await node.request("DELETE", f"/v1/registrations/{registration['id']}", token=sam)
    assert gone.status_code == 204
    still = await node.request("GET", "/v1/registrations", token=alex)
    assert [r["id"] for r in still.json()["registrations"]] == [registration["id"]]

    prefs = await node.request("GET", "/v1/preferences", token=sam)
    assert prefs.json()["categories"]["admin"] is True
    level = await node.request("GET", "/v1/threads/t1/follow", token=sam)
    assert level.json()["is_default"] is True
    read = await node.request("PUT", "/v1/threads/t1/read", json={"seq": 1}, token=sam)
    assert read.json()["last_read_seq"] == 1


DEVICE_ENDPOINTS: list[tuple[str, str, Any]] = [
    ("GET", "/v1/preferences", None),
    ("PUT", "/v1/preferences", {"categories": {"admin": False}}),
    ("GET", "/v1/threads/t1/follow", None),
    ("PUT", "/v1/threads/t1/follow", {"level": "all"}),
    ("PUT", "/v1/threads/t1/read", {"seq": 1}),
    ("GET", "/v1/catalogue", None),
    ("GET", "/v1/registrations", None),
    ("POST", "/v1/registrations", {"provider": "fake", "token": "tok"}),
    # An id of the registrations' form: another form is answered without the handler.
    ("DELETE", "/v1/registrations/0190a6e8-7c3a-7000-8000-000000000001", None),
]


async def test_every_device_endpoint_refuses_a_request_without_a_token(launch: Launch) -> None:
    node = await launch()
    for method, path, body in DEVICE_ENDPOINTS:
        response = await node.request(method, path, json=body)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "unauthorized"


async def test_every_device_endpoint_refuses_a_revoked_device(launch: Launch) -> None:
    node = await launch()
    await node.append(
        ev("device.upserted", device_id="lost", user_id="alex", platform="ios", state="revoked")
    )
    await node.settle()
    token = device_token("alex", "lost")
    for method, path, body in DEVICE_ENDPOINTS:
        response = await node.request(method, path, json=body, token=token)
        assert response.status_code == 403, (method, path)
        assert response.json()["error"] == {
            "code": "device_revoked",
            "message": "this device has been revoked",
        }
    assert await node.sql("SELECT count(*) FROM bothy.preferences") == [(0,)]
    assert await node.sql("SELECT count(*) FROM bothy.follows") == [(0,)]
