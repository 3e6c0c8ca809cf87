"""The verifier answers every token with claims or :class:`AuthError`, never another
exception (a 500 over HTTP, a dropped connection on the gateway)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bothy_notify.auth import PLATFORMS, PRINCIPAL_KINDS, AuthError, ScopeError, TokenVerifier
from bothy_notify.kernel.ids import is_valid_id
from tests.harness import TEST_KEY, make_config
from tests.hostile.tokens import (
    HS256,
    device,
    malformed_device_tokens,
    odd_scope_producer_tokens,
    raw,
)

KEYED = make_config(
    auth={
        "keys": [
            {"algorithm": "HS256", "key": TEST_KEY, "kid": "k1"},
            {"algorithm": "HS256", "key": "x" * 32 + "another-key", "kid": "k2"},
        ]
    }
)


AUDIENCE = make_config(auth={"issuer": "https://issuer.test", "audience": "bothy"})


def verifiers() -> list[TokenVerifier]:
    """Without ``kid``s, with keys picked by ``kid``, and with issuer and audience."""
    return [TokenVerifier(c.auth) for c in (make_config(), KEYED, AUDIENCE)]


@pytest.mark.parametrize(
    ("token"),
    [t for _, t in malformed_device_tokens()],
    ids=[n for n, _ in malformed_device_tokens()],
)
def test_a_malformed_device_token_raises_auth_error_only(token: str) -> None:
    for verifier in verifiers():
        with pytest.raises(AuthError) as raised:
            verifier.device(token)
        assert type(raised.value) is AuthError


@pytest.mark.parametrize(
    ("token"),
    [t for _, t in odd_scope_producer_tokens()],
    ids=[n for n, _ in odd_scope_producer_tokens()],
)
def test_a_producer_token_with_an_odd_scope_raises_scope_error(token: str) -> None:
    with pytest.raises(ScopeError):
        TokenVerifier(make_config().auth).producer(token)


@pytest.mark.parametrize(
    "kid",
    ["é", "\ud800", "k1\x00", "ķ1", "k" * 256],
    ids=["latin", "surrogate", "nul", "latvian", "256 chars"],
)
def test_a_kid_of_any_text_is_compared_without_error(kid: str) -> None:
    token = raw({"alg": "HS256", "kid": kid}, device())

    with pytest.raises(AuthError, match="no key for this token"):
        TokenVerifier(KEYED.auth).device(token)


def test_the_kid_picks_the_key() -> None:
    verifier = TokenVerifier(KEYED.auth)

    assert verifier.device(raw({"alg": "HS256", "kid": "k1"}, device())).user_id == "mallory"
    with pytest.raises(AuthError, match="bad token signature"):
        verifier.device(raw({"alg": "HS256", "kid": "k2"}, device()))


def test_an_exp_beyond_what_a_datetime_holds_is_read_as_the_latest_instant() -> None:
    token = raw(HS256, json.dumps(device(exp=0)).replace('"exp": 0', f'"exp": {10**30}').encode())

    claims = TokenVerifier(make_config().auth).device(token)

    assert claims.expires_at is not None and claims.expires_at.year == 9999


def test_device_claims_carry_the_token_expiry() -> None:
    claims = TokenVerifier(make_config().auth).device(raw(HS256, device(exp=2_000_000_000)))

    assert claims.expires_at is not None
    assert int(claims.expires_at.timestamp()) == 2_000_000_000


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_an_auth_error(text: str) -> None:
    for verifier in verifiers():
        with pytest.raises(AuthError):
            verifier.device(text)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_any_signed_bytes_are_an_auth_error(header: bytes, claims: bytes) -> None:
    token = raw(header, claims)
    for verifier in verifiers():
        with pytest.raises(AuthError):
            verifier.device(token)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None)
@given(
    st.fixed_dictionaries(
        {"alg": st.just("HS256") | JSON_VALUES},
        optional={k: JSON_VALUES for k in ("kid", "typ", "crit", "b64", "jku")},
    ),
    st.dictionaries(
        st.sampled_from(["sub", "did", "plat", "kind", "exp", "nbf", "iat", "iss", "aud", "scope"]),
        JSON_VALUES,
    ),
)
def test_any_json_header_and_claims_give_valid_device_claims_or_an_auth_error(
    header: dict[str, object], claims: dict[str, object]
) -> None:
    token = raw(json.dumps(header).encode(), json.dumps(claims).encode())
    for verifier in verifiers():
        try:
            accepted = verifier.device(token)
        except AuthError:
            continue
        # Whatever got through is a well-formed device token.
        assert header["alg"] == "HS256"
        assert is_valid_id(accepted.user_id) and is_valid_id(accepted.device_id)
        assert accepted.platform in PLATFORMS and accepted.kind in PRINCIPAL_KINDS
        assert accepted.expires_at is not None and accepted.expires_at.timestamp() > time.time()
