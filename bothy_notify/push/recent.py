"""Provider sends of the last minutes, for the operator's status page.

:class:`RecentSends` counts this process's send attempts by (provider, app,
outcome) in buckets of :data:`BUCKET_SECONDS`, keeping :data:`WINDOW_SECONDS`
of them, and remembers each (provider, app)'s last error class (the outcome
and the provider's reason code, ``transient:http_503``, never a token, URL or
ID) with its time. ``app`` is the provider's app where the configuration names
one (``None`` otherwise), so a provider that serves several apps reports each.

Recording is a dictionary increment on the send path (no lock: Trio runs one
task at a time); reading builds the sums.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_SECONDS = 300
"""How far back the sums reach: the last 5 minutes."""
BUCKET_SECONDS = 10
"""The window moves in steps of this many seconds."""

Key = tuple[str, str | None]
"""(provider, app)."""
_REASON = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A reason code as the providers write them; anything else (a provider's answer
is not ours to trust) is shown as ``other``."""


@dataclass(frozen=True, slots=True)
class ProviderWindow:
    """One (provider, app)'s sends of the window.

    Attributes:
        provider: ``apns``, ``fcm``, ``webhook``, ``fake``...
        app: the configured app, or ``None`` where the provider names none.
        sends: attempts by outcome (``delivered``, ``transient``, ``rejected``,
            ``mismatch``, ``dead``) within the window.
        last_error: the class of the newest attempt that did not deliver
            (``"transient:http_503"``), whenever it was; ``None`` if none yet.
        last_error_at: its Unix time.
    """

    provider: str
    app: str | None
    sends: dict[str, int]
    last_error: str | None
    last_error_at: float | None


class RecentSends:
    """Send attempts of this process in the last :data:`WINDOW_SECONDS`.

    Args:
        now: the Unix time (tests pass their own).
    """

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._buckets: deque[tuple[int, dict[tuple[str, str | None, str], int]]] = deque()
        self._last_error: dict[Key, tuple[str, float]] = {}

    def __repr__(self) -> str:
        return f"RecentSends(buckets={len(self._buckets)})"

    def record(self, provider: str, app: str | None, outcome: str, reason: str = "") -> None:
        """Count one attempt; an outcome other than ``delivered`` is the last error."""
        now = self._now()
        slot = int(now // BUCKET_SECONDS)
        buckets = self._buckets
        if not buckets or buckets[-1][0] != slot:
            buckets.append((slot, {}))
            self._expire(slot)
        counts = buckets[-1][1]
        key = (provider, app, outcome)
        counts[key] = counts.get(key, 0) + 1
        if outcome != "delivered":
            if reason and _REASON.fullmatch(reason) is None:
                reason = "other"
            self._last_error[(provider, app)] = (f"{outcome}:{reason}" if reason else outcome, now)

    def _expire(self, slot: int) -> None:
        oldest = slot - WINDOW_SECONDS // BUCKET_SECONDS + 1
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()

    def snapshot(self) -> list[ProviderWindow]:
        """Every (provider, app) with sends in the window or a last error, sorted."""
        self._expire(int(self._now() // BUCKET_SECONDS))
        sums: dict[Key, dict[str, int]] = {}
        for _slot, counts in self._buckets:
            for (provider, app, outcome), n in counts.items():
                per = sums.setdefault((provider, app), {})
                per[outcome] = per.get(outcome, 0) + n
        keys = set(sums) | set(self._last_error)
        out = []
        for key in sorted(keys, key=lambda k: (k[0], k[1] or "")):
            error = self._last_error.get(key)
            out.append(
                ProviderWindow(
                    provider=key[0],
                    app=key[1],
                    sends=sums.get(key, {}),
                    last_error=error[0] if error else None,
                    last_error_at=error[1] if error else None,
                )
            )
        return out
