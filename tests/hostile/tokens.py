"""Malformed and hostile tokens, for the verifier, the HTTP API and the gateway alike.

Each case is a name and a token. Tokens that need a valid signature are signed
with the test key over raw bytes (PyJWT would refuse to build most of them), so
they get past the signature and test what comes after it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from tests.harness import TEST_KEY

OTHER_KEY = "a-key-nobody-configured-0123456789abcdef"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def raw(header: bytes | dict[str, Any], claims: bytes | dict[str, Any], key: str = TEST_KEY) -> str:
    """A compact JWS over exactly these bytes, HMAC-SHA256-signed with ``key``."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = claims if isinstance(claims, bytes) else json.dumps(claims).encode()
    signing_input = f"{b64(head)}.{b64(body)}"
    signature = hmac.new(key.encode(), signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def later() -> int:
    return int(time.time()) + 3600


def device(**changes: Any) -> dict[str, Any]:
    """Valid device claims with ``changes`` applied (a value of ``...`` removes the claim)."""
    claims: dict[str, Any] = {
        "sub": "mallory",
        "did": "mallory-laptop",
        "plat": "linux",
        "kind": "user",
        "exp": later(),
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not ...}


HS256 = {"alg": "HS256", "typ": "JWT"}
DEEP = b"[" * 2000 + b"]" * 2000
"""Nested past Python's recursion limit, yet well within the token size limit."""


def malformed_device_tokens() -> list[tuple[str, str]]:
    """Every token here must be refused as a device token: HTTP 401, gateway 4001."""
    good = raw(HS256, device())
    head, body, signature = good.split(".")
    return [
        # -- the compact form
        ("empty", ""),
        ("one segment", "not-a-jwt"),
        ("two segments", f"{head}.{body}"),
        ("four segments", f"{good}.{signature}"),
        ("bad base64 in the header", f"!!{head}.{body}.{signature}"),
        ("bad base64 padding", f"{head}A.{body}.{signature}"),
        ("whitespace inside", f"{head} .{body}.{signature}"),
        ("non-ASCII characters", f"{head}é.{body}.{signature}"),
        ("a lone surrogate", f"{head}\ud800.{body}.{signature}"),
        ("only a lone surrogate", "\ud800"),
        ("oversized", f"{head}.{body}{'A' * 20_000}.{signature}"),
        ("signature stripped", f"{head}.{body}."),
        ("signed with another key", raw(HS256, device(), key=OTHER_KEY)),
        # -- the header
        ("header not JSON", raw(b"not json", device())),
        ("header not UTF-8", raw(b"\xff\xfe{}", device())),
        ("header a list", raw(b'["HS256"]', device())),
        ("header a string", raw(b'"HS256"', device())),
        ("header null", raw(b"null", device())),
        ("header nested too deep", raw(DEEP, device())),
        ("alg missing", raw({"typ": "JWT"}, device())),
        ("alg none", raw({"alg": "none"}, device())),
        ("alg NONE", raw({"alg": "NONE"}, device())),
        ("alg null", raw({"alg": None}, device())),
        ("alg a number", raw({"alg": 256}, device())),
        ("alg a list", raw({"alg": ["HS256"]}, device())),
        ("alg an object", raw({"alg": {"HS256": True}}, device())),
        ("alg not configured", raw({"alg": "HS512"}, device())),
        ("alg of a key type not configured", raw({"alg": "RS256"}, device())),
        ("kid a number", raw({"alg": "HS256", "kid": 7}, device())),
        ("kid null", raw({"alg": "HS256", "kid": None}, device())),
        ("kid a list", raw({"alg": "HS256", "kid": ["k1"]}, device())),
        ("kid too long", raw({"alg": "HS256", "kid": "k" * 300}, device())),
        ("crit not understood", raw({"alg": "HS256", "crit": ["exp"]}, device())),
        ("b64 false", raw({"alg": "HS256", "b64": False}, device())),
        # -- the claims
        ("claims not JSON", raw(HS256, b"not json")),
        ("claims not UTF-8", raw(HS256, b"\xff\xfe{}")),
        ("claims a list", raw(HS256, b"[1]")),
        ("claims nested too deep", raw(HS256, DEEP)),
        ("exp missing", raw(HS256, device(exp=...))),
        ("exp in the past", raw(HS256, device(exp=int(time.time()) - 3600))),
        ("exp a string", raw(HS256, device(exp=str(later())))),
        ("exp null", raw(HS256, device(exp=None))),
        ("exp true", raw(HS256, device(exp=True))),
        ("exp a list", raw(HS256, device(exp=[later()]))),
        ("exp NaN", raw(HS256, json.dumps(device(exp=float("nan"))).encode())),
        ("exp Infinity", raw(HS256, json.dumps(device(exp=float("inf"))).encode())),
        (
            "exp 1e999",
            raw(HS256, json.dumps(device(exp=0)).replace('"exp": 0', '"exp": 1e999').encode()),
        ),
        (
            "exp 5000 digits",
            raw(
                HS256,
                json.dumps(device(exp=0)).replace('"exp": 0', f'"exp": {"9" * 5000}').encode(),
            ),
        ),
        ("nbf in the future", raw(HS256, device(nbf=later()))),
        ("nbf a string", raw(HS256, device(nbf="0"))),
        ("iat a string", raw(HS256, device(iat="yesterday"))),
        ("sub missing", raw(HS256, device(sub=...))),
        ("sub empty", raw(HS256, device(sub=""))),
        ("sub a number", raw(HS256, device(sub=7))),
        ("sub a list", raw(HS256, device(sub=["mallory"]))),
        ("sub not an ID", raw(HS256, device(sub="mallory mallory"))),
        ("sub too long", raw(HS256, device(sub="m" * 129))),
        ("sub a lone surrogate", raw(HS256, device(sub="\ud800"))),
        ("did missing", raw(HS256, device(did=...))),
        ("did null", raw(HS256, device(did=None))),
        ("did an object", raw(HS256, device(did={"id": "x"}))),
        ("did not an ID", raw(HS256, device(did="../etc"))),
        ("plat missing", raw(HS256, device(plat=...))),
        ("plat unknown", raw(HS256, device(plat="symbian"))),
        ("plat a number", raw(HS256, device(plat=1))),
        ("plat a list", raw(HS256, device(plat=["ios"]))),
        ("kind unknown", raw(HS256, device(kind="robot"))),
        ("kind null", raw(HS256, device(kind=None))),
        ("kind a list", raw(HS256, device(kind=["user"]))),
    ]


def odd_scope_producer_tokens() -> list[tuple[str, str]]:
    """Producer tokens, valid but for ``scope``: refused with 403 ``forbidden``."""
    claims = {"sub": "backend", "exp": later()}
    return [
        ("scope missing", raw(HS256, claims)),
        ("scope a number", raw(HS256, {**claims, "scope": 7})),
        ("scope a list", raw(HS256, {**claims, "scope": ["events:write"]})),
        ("scope an object", raw(HS256, {**claims, "scope": {"events:write": True}})),
        ("scope of another right", raw(HS256, {**claims, "scope": "events:read"})),
        ("scope a prefix", raw(HS256, {**claims, "scope": "events:writer"})),
    ]
