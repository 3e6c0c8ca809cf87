"""The verifier's memory of verified tokens: a token seen before is answered from
memory while it is within its time limits, and never past them."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from bothy_notify.auth import AuthError, ScopeError, TokenVerifier, VerifiedTokens, mint_token
from tests.harness import TEST_KEY, make_config


def test_a_token_seen_before_is_answered_from_memory_with_the_same_claims() -> None:
    verifier = TokenVerifier(make_config().auth)
    token = mint_token(TEST_KEY, {"sub": "alex", "did": "alex-phone", "plat": "ios"})
    first = verifier.device(token)
    assert verifier.verified.hits == 0
    again = verifier.device(token)
    assert again == first
    assert verifier.verified.hits == 1
    claims = verifier.decode(token)
    assert claims["sub"] == "alex"
    with pytest.raises(TypeError):
        claims["sub"] = "mallory"  # type: ignore[index]  # shared: read-only


def test_a_remembered_producer_token_without_the_scope_is_still_refused() -> None:
    verifier = TokenVerifier(make_config().auth)
    token = mint_token(TEST_KEY, {"sub": "app", "scope": "events:read"})
    for _ in range(2):
        with pytest.raises(ScopeError):
            verifier.producer(token)
    assert verifier.verified.hits == 1


def test_tokens_that_fail_are_not_remembered() -> None:
    verifier = TokenVerifier(make_config().auth)
    bad = [
        "not-a-token",
        mint_token("y" * 40, {"sub": "alex", "did": "d", "plat": "ios"}),  # another key
        mint_token(TEST_KEY, {"sub": "alex"}, lifetime=timedelta(seconds=-60)),  # expired
    ]
    for token in bad:
        for _ in range(2):
            with pytest.raises(AuthError):
                verifier.decode(token)
    assert len(verifier.verified) == 0


def test_a_remembered_token_past_its_expiry_and_leeway_is_forgotten() -> None:
    now = [1_000_000.0]
    memory = VerifiedTokens(timedelta(seconds=30), now=lambda: now[0])
    memory.put("t", {"exp": 1_000_100, "sub": "alex"})
    now[0] = 1_000_129.0  # past exp, within the leeway
    assert memory.get("t") is not None
    now[0] = 1_000_130.0  # exp + leeway: PyJWT's "expired"
    assert memory.get("t") is None
    assert len(memory) == 0


def test_a_remembered_token_before_its_not_before_is_not_answered() -> None:
    now = [1_000_000.0]
    memory = VerifiedTokens(timedelta(seconds=0), now=lambda: now[0])
    memory.put("t", {"exp": 2_000_000, "nbf": 1_000_000})
    now[0] = 999_999.0  # the clock went back past nbf
    assert memory.get("t") is None


def test_the_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    memory = VerifiedTokens(timedelta(0), size=2)
    exp = time.time() + 600
    for token in ("a", "b", "c"):
        memory.put(token, {"exp": exp})
    assert len(memory) == 2
    assert memory.get("a") is None
    assert memory.get("b") is not None and memory.get("c") is not None


def test_the_repr_never_shows_a_token() -> None:
    verifier = TokenVerifier(make_config().auth)
    token = mint_token(TEST_KEY, {"sub": "alex", "did": "alex-phone", "plat": "ios"})
    verifier.device(token)
    assert token not in repr(verifier.verified)
    assert repr(verifier.verified) == "VerifiedTokens(tokens=1)"
