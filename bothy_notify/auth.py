"""JWT verification for devices (HTTP API and gateway) and producers.

Tokens are verified with PyJWT against the configured keys: signature,
``exp`` (required), ``nbf`` when present, issuer and audience when configured,
with ``auth.leeway`` of clock skew. A device token names its person (``sub``),
device (``did``), platform (``plat``) and principal kind (``kind``); a token
acts only for its own ``sub``. A producer token carries ``scope`` containing
``events:write``; an operator token (the status page) ``admin:read`` or
``admin:write``.

Whatever a token holds, verifying it either succeeds or raises
:class:`AuthError`: the compact form is checked before any decoding (three
base64url segments, ASCII only, at most :data:`MAX_TOKEN_CHARS`), ``alg`` and
``kid`` must be strings, the time claims (``exp``, ``nbf``, ``iat``) JSON
numbers, and anything the library raises on input it cannot read (bad
base64, JSON that is not an object, nesting too deep, numbers out of range)
is translated here, once.

Verified tokens are remembered (:class:`VerifiedTokens`): a client presents the
same token on every request, so a token seen before is not verified again, its
claims come from memory and only its time limits (``exp``, ``nbf``, with the
leeway) are checked against the clock again on every use.

Errors (never carrying the token or any claim value)::

    AuthError          401: missing, malformed, expired or badly signed
    └── ScopeError     403: valid, but not allowed to do this
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import jwt

from bothy_notify.config import AuthConfig, ConfigError, JwtAlgorithm
from bothy_notify.kernel.ids import is_valid_id

PLATFORMS = ("ios", "android", "macos", "windows", "linux", "web")
PRINCIPAL_KINDS = ("user", "agent", "app")
EVENTS_WRITE = "events:write"
ADMIN_READ = "admin:read"
"""Operator scope: ``GET /v1/admin/status`` (the status page)."""
ADMIN_WRITE = "admin:write"
"""Operator scope: the status page's actions (retry or discard dead letters); implies
``admin:read``."""
HS256_MIN_BYTES = 32
"""RFC 7518 section 3.2: an HMAC key at least as long as the hash output."""
MAX_TOKEN_CHARS = 16_384
"""Longest token accepted; real device and producer tokens are well under 2 KiB."""
MAX_KID_CHARS = 256
"""Longest ``kid`` header compared against the configured keys' ``kid``."""
LATEST_EXPIRY = 253_402_300_799
"""9999-12-31T23:59:59Z, the latest instant a ``datetime`` holds: later ``exp`` values
are read as this one (such a token never expires in practice)."""
LATEST_INSTANT = datetime.max.replace(tzinfo=UTC)
"""The latest instant a ``datetime`` holds; deadlines computed from a token stop here."""
TIME_CLAIMS = ("exp", "nbf", "iat")
"""NumericDate claims (RFC 7519 section 2): JSON numbers when present."""
VERIFIED_TOKENS = 10_000
"""Verified tokens one verifier remembers (about 1 KB each: the token and its claims)."""

_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
"""The JWS compact serialization: three base64url segments (the signature may be empty)."""
_UNREADABLE = (jwt.PyJWTError, ValueError, TypeError, OverflowError, RecursionError)
"""What PyJWT (and the ``json`` and ``base64`` modules under it) raise on input it
cannot read; ``UnicodeError`` and ``binascii.Error`` are both a ``ValueError``."""


class AuthError(Exception):
    """The token cannot be used (HTTP 401, gateway close 4001)."""

    code = "unauthorized"


class ScopeError(AuthError):
    """The token is valid but lacks the right (HTTP 403)."""

    code = "forbidden"


@dataclass(frozen=True, slots=True)
class DeviceClaims:
    """Who a device token speaks for. The repr shows no IDs."""

    user_id: str
    device_id: str
    platform: str
    kind: str
    expires_at: datetime | None = None
    """The token's ``exp`` (``None``: a value built without a token, such as in tests)."""

    @property
    def is_human(self) -> bool:
        return self.kind == "user"

    def __repr__(self) -> str:
        return f"DeviceClaims(platform={self.platform!r}, kind={self.kind!r})"


@dataclass(frozen=True, slots=True)
class ProducerClaims:
    subject: str
    scopes: frozenset[str]

    def __repr__(self) -> str:
        return f"ProducerClaims(scopes={sorted(self.scopes)!r})"


class VerifiedTokens:
    """The claims of tokens verified before, by token, for as long as each is valid.

    At most ``size`` tokens; when full, the one remembered longest is forgotten
    first. A hit costs a dictionary look-up and the time checks that
    verification itself makes (``exp``, and ``nbf`` when present, each with
    ``leeway``, against ``now()``, ``time.time`` as PyJWT reads it): an expired token is
    forgotten and verified again, which refuses it. Only tokens that verified
    are remembered, so a flood of bad tokens costs each its own verification and
    leaves nothing here. The repr shows the count only, never a token.
    """

    def __init__(
        self,
        leeway: timedelta,
        size: int = VERIFIED_TOKENS,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._leeway = leeway.total_seconds()
        self._size = size
        self._now = now
        self._claims: dict[str, Mapping[str, Any]] = {}
        self.hits = 0
        """Verifications answered from memory (statistics, tests)."""

    def __len__(self) -> int:
        return len(self._claims)

    def __repr__(self) -> str:
        return f"VerifiedTokens(tokens={len(self._claims)})"

    def get(self, token: str) -> Mapping[str, Any] | None:
        """The claims of ``token`` if it verified before and is still within its time
        limits now; ``None`` otherwise (verify it)."""
        claims = self._claims.get(token)
        if claims is None:
            return None
        now = self._now()
        nbf = claims.get("nbf")
        if claims["exp"] <= now - self._leeway or (nbf is not None and nbf > now + self._leeway):
            del self._claims[token]
            return None
        self.hits += 1
        return claims

    def put(self, token: str, claims: Mapping[str, Any]) -> Mapping[str, Any]:
        """Remember the verified ``claims`` of ``token``; returns them read-only."""
        frozen = MappingProxyType(dict(claims))
        if len(self._claims) >= self._size:
            del self._claims[next(iter(self._claims))]
        self._claims[token] = frozen
        return frozen


class TokenVerifier:
    """Verifies tokens against ``auth.*``; safe to share across tasks. Tokens that
    verified are remembered (:class:`VerifiedTokens`)."""

    def __init__(self, config: AuthConfig) -> None:
        self._config = config
        self._algorithms = [a.value for a in config.algorithms]
        self._keys: list[tuple[str, str, Any]] = []
        for index, key in enumerate(config.keys):
            material: Any = key.key.reveal()
            if key.algorithm is JwtAlgorithm.HS256 and len(material.encode()) < HS256_MIN_BYTES:
                raise ConfigError(
                    f"auth.keys[{index}].key: an HS256 secret needs at least 32 bytes"
                )
            if key.algorithm is not JwtAlgorithm.HS256:
                algorithm = jwt.algorithms.get_default_algorithms()[key.algorithm.value]
                try:
                    material = algorithm.prepare_key(material)
                except (ValueError, TypeError, jwt.PyJWTError):
                    raise ConfigError(
                        f"auth.keys[{index}].key: not a PEM public key for {key.algorithm.value}"
                    ) from None
            self._keys.append((key.algorithm.value, key.kid, material))
        self._leeway = config.leeway
        self.verified = VerifiedTokens(config.leeway)

    def __repr__(self) -> str:
        return f"TokenVerifier(keys={len(self._keys)})"

    @property
    def leeway(self) -> timedelta:
        """``auth.leeway``: the clock skew allowed on ``exp`` and ``nbf``."""
        return self._leeway

    def decode(self, token: object) -> Mapping[str, Any]:
        """Verify ``token`` and return its claims (read-only).

        A token verified before and still within its time limits is answered
        from :attr:`verified` without verifying it again.

        Raises:
            AuthError: for every token that is not a valid, current token of a
                configured key, whatever its content (never another exception).
        """
        if isinstance(token, str):
            known = self.verified.get(token)
            if known is not None:
                return known
        claims = self._verify(token)
        assert isinstance(token, str)  # _verify refuses anything else
        return self.verified.put(token, claims)

    def _verify(self, token: object) -> Mapping[str, Any]:
        """:meth:`decode` without the memory of verified tokens."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise AuthError("missing or oversized token")
        if _COMPACT.fullmatch(token) is None:
            raise AuthError("malformed token")
        try:
            header = jwt.get_unverified_header(token)
        except _UNREADABLE:
            raise AuthError("malformed token") from None
        alg, kid = header.get("alg"), header.get("kid", "")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise AuthError("token algorithm not accepted")
        if not isinstance(kid, str) or len(kid) > MAX_KID_CHARS:
            raise AuthError("malformed token")
        # Bytes: compare_digest refuses str with non-ASCII characters, and a kid
        # may hold any character JSON can escape, lone surrogates included.
        wanted = kid.encode("utf-8", "surrogatepass")
        candidates = [
            material
            for key_alg, key_kid, material in self._keys
            if key_alg == alg
            and (not key_kid or not kid or hmac.compare_digest(key_kid.encode(), wanted))
        ]
        if not candidates:
            raise AuthError("no key for this token")
        options: Any = {"require": ["exp"], "verify_aud": bool(self._config.audience)}
        kwargs: dict[str, Any] = {}
        if self._config.audience:
            kwargs["audience"] = self._config.audience
        if self._config.issuer:
            kwargs["issuer"] = self._config.issuer
            options["require"] = ["exp", "iss"]
        last: Exception | None = None
        for material in candidates:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    material,
                    algorithms=[alg],
                    options=options,
                    leeway=self._leeway,
                    **kwargs,
                )
            except jwt.InvalidSignatureError as exc:
                last = exc
                continue
            except jwt.ExpiredSignatureError:
                raise AuthError("token expired") from None
            except jwt.ImmatureSignatureError:
                raise AuthError("token not yet valid") from None
            except _UNREADABLE:
                raise AuthError("invalid token") from None
            for name in TIME_CLAIMS:
                if name in claims and not _is_number(claims[name]):
                    raise AuthError("a time claim is not a number")
            return claims
        raise AuthError("bad token signature") from last

    def device(self, token: object) -> DeviceClaims:
        """Verify a device token (``sub``, ``did``, ``plat``, ``kind``, ``exp``).

        Raises :class:`AuthError` for every token that is not one.
        """
        claims = self.decode(token)
        sub, did, plat = claims.get("sub"), claims.get("did"), claims.get("plat")
        kind = claims.get("kind", "user")
        if not (is_valid_id(sub) and is_valid_id(did)):
            raise AuthError("token lacks a valid sub or did")
        if plat not in PLATFORMS or kind not in PRINCIPAL_KINDS:
            raise AuthError("token lacks a valid plat or kind")
        assert isinstance(sub, str) and isinstance(did, str) and isinstance(plat, str)
        expires_at = datetime.fromtimestamp(min(claims["exp"], LATEST_EXPIRY), UTC)
        return DeviceClaims(sub, did, plat, str(kind), expires_at)

    def operator(self, token: object, scope: str) -> ProducerClaims:
        """Verify an operator token; raises :class:`ScopeError` without ``scope``
        (``admin:read`` or ``admin:write``; ``admin:write`` includes ``admin:read``)."""
        claims = self.decode(token)
        scopes = _scopes(claims)
        if scope not in scopes and not (scope == ADMIN_READ and ADMIN_WRITE in scopes):
            raise ScopeError(f"token lacks scope {scope}")
        return ProducerClaims(str(claims.get("sub", "")), scopes)

    def producer(self, token: object) -> ProducerClaims:
        """Verify a producer token; raises :class:`ScopeError` without ``events:write``."""
        claims = self.decode(token)
        scopes = _scopes(claims)
        if EVENTS_WRITE not in scopes:
            raise ScopeError("token lacks scope events:write")
        return ProducerClaims(str(claims.get("sub", "")), scopes)


def accepted_until(expires_at: datetime, leeway: timedelta) -> datetime:
    """The instant a token whose ``exp`` is ``expires_at`` stops being accepted:
    ``exp`` plus ``auth.leeway``, as :meth:`TokenVerifier.decode` judges it.

    Saturates at :data:`LATEST_INSTANT` (``exp`` 9999-12-31T23:59:59Z plus any
    leeway is that instant), so a deadline taken from any token the verifier
    accepts never overflows. Every deadline computed from a token's expiry (the
    gateway's expiry watch) goes through here.
    """
    if expires_at >= LATEST_INSTANT - leeway:
        return LATEST_INSTANT
    return expires_at + leeway


def _scopes(claims: Mapping[str, Any]) -> frozenset[str]:
    """The space-separated ``scope`` claim as a set (empty when absent or not a string)."""
    scope = claims.get("scope", "")
    return frozenset(scope.split()) if isinstance(scope, str) else frozenset()


def _is_number(value: object) -> bool:
    """A finite JSON number (``true`` is not one, though Python's ``bool`` is an ``int``)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def mint_token(
    key: str,
    claims: Mapping[str, Any],
    *,
    lifetime: timedelta = timedelta(hours=12),
    algorithm: str = "HS256",
    now: datetime | None = None,
    headers: Mapping[str, Any] | None = None,
) -> str:
    """Sign a token (``dev-token``, the demo, tests). Adds ``iat`` and ``exp``."""
    issued = now or datetime.now(UTC)
    body = dict(claims)
    body.setdefault("iat", int(issued.timestamp()))
    body.setdefault("exp", int((issued + lifetime).timestamp()))
    return jwt.encode(body, key, algorithm=algorithm, headers=dict(headers or {}))
