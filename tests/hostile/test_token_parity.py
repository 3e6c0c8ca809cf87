"""A token is accepted or refused alike on HTTP and on the gateway (issue 24, item 2).

One daemon (its HTTP API and its gateway on real sockets) and tokens generated
by hypothesis: ``exp`` from long past to beyond the largest instant a datetime
holds (9999-12-31T23:59:59Z, and JSON numbers far past it), ``nbf`` and
``iat`` before and after now, inside and outside ``auth.leeway``, ``kid``
matching, mismatching or absent, ``aud`` right, wrong or absent, and the
three configured algorithms, each signed with the right key, a wrong key, or
not at all. Every token goes to ``GET /v1/preferences`` and to the gateway's
``identify``: both accept it (200, and ``catchup.complete`` then a ``pong``:
the connection lives on with its expiry watched) or both refuse it (401, and
the close 4001 ``authentication failed``, never a connection dropped without
a close, 1006).

Generated instants keep :data:`MARGIN` seconds off every boundary of the
verifier's (now plus or minus the leeway), so the few milliseconds between the
two requests cannot change the answer.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bothy_notify.auth import LATEST_EXPIRY, LATEST_INSTANT, accepted_until
from bothy_notify.kernel.clock import FakeClock
from gateway.service import build_gateway
from testkit.ws import GatewayClient
from tests.harness import TEST_KEY, Launch, Node, make_config

LEEWAY = 30
MARGIN = 10
"""Seconds every generated instant keeps off ``now`` and ``now +- leeway``."""
AUDIENCE = "bothy-parity"
EXAMPLES = 40
"""Hypothesis examples: each costs one HTTP request and one gateway connection."""
OTHER_HS256 = "another-hs256-key-nobody-configured-0123"


def _private(key: Any) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _public(key: Any) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


RSA, OTHER_RSA = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in "ab")
EC, OTHER_EC = (ec.generate_private_key(ec.SECP256R1()) for _ in "ab")


@dataclass(frozen=True)
class Signer:
    """How a token is signed: the algorithm, the key, and whether the daemon knows it."""

    name: str
    algorithm: str
    key: str
    kid: str
    configured: bool


SIGNERS = [
    Signer("hs256", "HS256", TEST_KEY, "hs", True),
    Signer("rs256", "RS256", _private(RSA), "rs", True),
    Signer("es256", "ES256", _private(EC), "es", True),
    Signer("hs256 unknown key", "HS256", OTHER_HS256, "hs", False),
    Signer("rs256 unknown key", "RS256", _private(OTHER_RSA), "rs", False),
    Signer("es256 unknown key", "ES256", _private(OTHER_EC), "es", False),
    Signer("hs384 not accepted", "HS384", TEST_KEY + "-and-more", "hs", False),
    Signer("none", "none", "", "", False),
]

ABSENT = object()


def _instants(now: int) -> st.SearchStrategy[object]:
    """``exp``/``nbf``/``iat`` values: JSON numbers from the far past to far past the
    largest datetime, and values that are not numbers, off every boundary."""
    lo, hi = now - LEEWAY, now + LEEWAY
    return st.one_of(
        st.integers(-(2**40), lo - MARGIN),  # long past, beyond the leeway
        st.integers(lo + MARGIN, now - MARGIN),  # past, within the leeway
        st.integers(now + MARGIN, hi - MARGIN),  # future, within the leeway
        _later(now),
        st.floats(lo + MARGIN, now - MARGIN),  # a fraction of a second, within the leeway
        st.sampled_from(["2000000000", True, None, [1], {"n": 1}]),  # not numbers
        st.just(ABSENT),
    )


def _later(now: int) -> st.SearchStrategy[object]:
    """Instants past ``now + leeway``, up to and far beyond the largest datetime."""
    return st.one_of(
        st.integers(now + LEEWAY + MARGIN, LATEST_EXPIRY + 10),
        st.sampled_from([LATEST_EXPIRY - 1, LATEST_EXPIRY, LATEST_EXPIRY + 1, 10**12, 10**30]),
        st.floats(now + LEEWAY + MARGIN, 1e308),  # a float past every datetime
    )


def _earlier(now: int) -> st.SearchStrategy[object]:
    """Instants before ``now`` (a valid ``nbf`` or ``iat``), or none."""
    return st.one_of(st.just(ABSENT), st.integers(-(2**40), now - MARGIN))


DIMENSIONS = ("signer", "kid", "aud", "plat", "exp", "nbf", "iat")


@st.composite
def tokens(draw: st.DrawFn, now: int, serial: Callable[[], int]) -> tuple[str, str]:
    """A valid token with at most two of its :data:`DIMENSIONS` drawn from every value
    (valid or not), and a description of how it was made (for the failure message).

    Mostly valid tokens, so the accepted side is tried across the whole range of
    ``exp`` (the largest values included) and not only the refused one.
    """
    free = draw(st.sets(st.sampled_from(DIMENSIONS), max_size=2))
    signers = SIGNERS if "signer" in free else [s for s in SIGNERS if s.configured]
    signer = draw(st.sampled_from(signers))
    n = serial()
    plats = ["linux", "macos", "ios", "toaster", 7] if "plat" in free else ["linux", "ios"]
    claims: dict[str, Any] = {
        "sub": f"parity-{n}",
        "did": f"parity-{n}-laptop",
        "plat": draw(st.sampled_from(plats)),
        "kind": draw(st.sampled_from(["user", "agent", "app"])),
    }
    within = st.integers(now - LEEWAY + MARGIN, now - MARGIN)  # expired, within the leeway
    exp = draw(_instants(now) if "exp" in free else st.one_of(_later(now), within))
    nbf = draw(_instants(now) if "nbf" in free else _earlier(now))
    iat = draw(_instants(now) if "iat" in free else _earlier(now))
    for name, value in (("exp", exp), ("nbf", nbf), ("iat", iat)):
        if value is not ABSENT:
            claims[name] = value
    audiences = [AUDIENCE, "someone-else", ABSENT] if "aud" in free else [AUDIENCE]
    audience = draw(st.sampled_from(audiences))
    if audience is not ABSENT:
        claims["aud"] = audience
    kids = ["right", "wrong", "absent", "not a string"] if "kid" in free else ["right", "absent"]
    kid = draw(st.sampled_from(kids))
    headers: dict[str, Any] = {}
    if kid == "right" and signer.kid:
        headers["kid"] = signer.kid
    elif kid == "wrong":
        headers["kid"] = "nobody"
    elif kid == "not a string":
        headers["kid"] = 7
    return sign(signer, headers, claims), f"{signer.name}, kid {kid}, claims {claims}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign(signer: Signer, headers: dict[str, Any], claims: dict[str, Any]) -> str:
    """A compact JWS of exactly this header and these claims (PyJWT's encoder refuses
    a ``kid`` that is not a string), signed by ``signer``'s algorithm and key."""
    header = {"alg": signer.algorithm, "typ": "JWT", **headers}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    algorithm = jwt.algorithms.get_default_algorithms()[signer.algorithm]
    key = algorithm.prepare_key(signer.key) if signer.key else None
    return f"{signing_input}.{_b64(algorithm.sign(signing_input.encode(), key))}"


async def gateway_answer(node: Node, token: str) -> tuple[bool, int | None]:
    """Whether ``identify`` with ``token`` made the connection live (and it then still
    answers a ping), and the close code when it did not."""
    assert node.addresses.gateway is not None
    client = await GatewayClient.open(node.addresses.gateway, receive_buffer=65536)
    try:
        assert await client.wait_hello() is not None
        await client.send_json({"op": "identify", "d": {"token": token}})
        if await client.read_until(lambda f: f.get("op") == "catchup.complete") is None:
            return False, client.close_code
        await client.send_json({"op": "ping"})
        pong = await client.read_until(lambda f: f.get("op") == "pong")
        return pong is not None, client.close_code
    finally:
        await client.aclose()


async def http_answer(node: Node, token: str) -> bool:
    """Whether ``GET /v1/preferences`` accepted ``token`` (200) rather than refused it (401)."""
    answer = await node.request("GET", "/v1/preferences", token=token)
    assert answer.status_code in (200, 401), answer.status_code
    return answer.status_code == 200


async def test_http_and_the_gateway_accept_and_refuse_the_same_tokens(launch: Launch) -> None:
    config = make_config(
        auth={
            "leeway": f"{LEEWAY}s",
            "audience": AUDIENCE,
            "keys": [
                {"algorithm": "HS256", "key": TEST_KEY, "kid": "hs"},
                {"algorithm": "RS256", "key": _public(RSA), "kid": "rs"},
                {"algorithm": "ES256", "key": _public(EC), "kid": "es"},
            ],
        },
        sync={"max_connections_per_person": 2},
    )
    # The expiry watch runs on the node's clock and the verifier on the wall clock:
    # start the one at the other, as in production.
    clock = FakeClock(datetime.now(UTC))
    node = await launch(config=config, clock=clock, gateway_factory=build_gateway)
    counter = itertools.count()
    seen = {"accepted": 0, "refused": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=tokens(int(time.time()), lambda: next(counter)))
    def same_answer(case: tuple[str, str]) -> None:
        token, made = case
        accepted = trio.from_thread.run(http_answer, node, token)
        live, code = trio.from_thread.run(gateway_answer, node, token)
        assert live == accepted, f"HTTP {'accepted' if accepted else 'refused'}: {made}"
        if not live:
            assert code == 4001, f"closed with {code}: {made}"
        seen["accepted" if accepted else "refused"] += 1

    await trio.to_thread.run_sync(same_answer)
    # Both answers came up, so the property was tried on each side.
    assert seen["accepted"] > 0 and seen["refused"] > 0, seen


async def test_the_largest_expiry_is_accepted_on_both_paths_and_by_reauth(
    launch: Launch,
) -> None:
    """The case the issue found: ``exp`` 9999-12-31T23:59:59Z (plus the leeway once
    overflowed the expiry watch and dropped the connection with 1006)."""
    node = await launch(
        config=make_config(auth={"leeway": f"{LEEWAY}s"}), gateway_factory=build_gateway
    )
    claims = {"sub": "sam", "did": "sam-laptop", "plat": "linux", "kind": "user"}
    token = jwt.encode({**claims, "exp": LATEST_EXPIRY}, TEST_KEY, algorithm="HS256")
    assert await http_answer(node, token)
    assert node.addresses.gateway is not None
    client = await GatewayClient.open(node.addresses.gateway, receive_buffer=65536)
    try:
        assert await client.wait_hello() is not None
        await client.send_json({"op": "identify", "d": {"token": token}})
        assert await client.read_until(lambda f: f.get("op") == "catchup.complete")
        await client.send_json({"op": "reauth", "d": {"token": token}})
        ack = await client.read_until(lambda f: f.get("op") == "reauth.ack")
        assert ack == {"op": "reauth.ack", "d": {"exp": LATEST_EXPIRY}}
        await client.send_json({"op": "ping"})
        assert await client.read_until(lambda f: f.get("op") == "pong")
    finally:
        await client.aclose()


@given(
    exp=st.one_of(
        st.integers(0, LATEST_EXPIRY), st.sampled_from([LATEST_EXPIRY - 300, LATEST_EXPIRY])
    ),
    leeway=st.integers(0, 300),
)
def test_a_deadline_from_a_token_saturates_at_the_latest_instant(exp: int, leeway: int) -> None:
    expires_at = datetime.fromtimestamp(exp, UTC)
    deadline = accepted_until(expires_at, timedelta(seconds=leeway))
    if exp + leeway <= LATEST_EXPIRY:
        assert deadline == expires_at + timedelta(seconds=leeway)
    else:
        assert deadline == LATEST_INSTANT
