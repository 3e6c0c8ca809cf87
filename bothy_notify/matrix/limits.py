"""The Matrix gateway's rate limit per source address; no IO.

A token bucket per address: ``matrix_gateway.requests_per_second`` refill it,
``matrix_gateway.requests_burst`` is its size, and every notify request takes one
token; a request that finds its bucket empty is answered 429
``M_LIMIT_EXCEEDED`` with ``retry_after_ms`` (the homeserver retries with its own
backoff). A homeserver behind several addresses gets a bucket per address; behind
a reverse proxy every request comes from the proxy's (the limit then holds for
all together; see ``docs/operations.md``).

At most :data:`ADDRESSES` buckets are kept: a full bucket says nothing a new one
would not, so full buckets are dropped first, then the ones idle longest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

ADDRESSES = 10_000
"""Source addresses tracked at once (homeservers are a handful; the bound is for a flood
from many addresses)."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class SourceLimits:
    """Token buckets by source address.

    Args:
        per_second: the refill rate (``matrix_gateway.requests_per_second``).
        burst: the bucket's size (``matrix_gateway.requests_burst``).
        now: seconds on a monotonic clock (injected: tests move it by hand).
        addresses: buckets kept at once.
    """

    def __init__(
        self,
        *,
        per_second: float,
        burst: int,
        now: Callable[[], float],
        addresses: int = ADDRESSES,
    ) -> None:
        self._rate = per_second
        self._burst = float(burst)
        self._now = now
        self._limit = addresses
        self._buckets: dict[str, _Bucket] = {}

    def __repr__(self) -> str:
        return f"SourceLimits(addresses={len(self._buckets)})"

    def take(self, address: str) -> float:
        """Take one token for a request from ``address``: 0.0 when it may go on, else the
        seconds until a token is back (the request is refused)."""
        now = self._now()
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= self._limit:
                self._make_room(now)
            bucket = self._buckets[address] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
            bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self._rate

    def _make_room(self, now: float) -> None:
        full = [
            address
            for address, b in self._buckets.items()
            if b.tokens + (now - b.at) * self._rate >= self._burst
        ]
        for address in full:
            del self._buckets[address]
        if len(self._buckets) >= self._limit:
            oldest = sorted(self._buckets.items(), key=lambda item: item[1].at)
            for address, _ in oldest[: max(1, len(oldest) // 10)]:
                del self._buckets[address]


def retry_after_ms(seconds: float) -> int:
    """``retry_after_ms`` of a refused request: whole milliseconds, at least 1."""
    return max(1, math.ceil(seconds * 1000))
