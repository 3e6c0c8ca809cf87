"""Threads grouped on the phone (issue 33): one opaque value per thread.

A phone groups a conversation's notifications by a value the push carries: APNs
``aps.thread-id`` (alert style) and ``apns-collapse-id``, FCM's data member
``tag`` (the app's notification tag and group), Web Push's ``Topic`` (which also
replaces a stale undelivered push of the thread at the push service). That value
is :meth:`ThreadGrouping.of`: HMAC-SHA256 of the thread id under a server key,
base64url, cut to 32 characters (RFC 8030's ``Topic`` limit; APNs takes 64), so
the grouping names no thread to Apple, Google or a browser's push service, and
nobody without the key can tell which thread a value stands for or guess it
from a list of thread ids.

The key is a secret the daemon makes itself: at start, ``wiring`` reads
:data:`GROUPING_SECRET` from the secret store and stores a new random one
(:func:`new_key`) when there is none (``store.secrets.ensure``: every node and
process of a cluster reads the same one). Replacing it (``bothy-notify secret set
bothy.thread_grouping``) changes every thread's value: notifications sent before
group apart from those sent after.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

GROUPING_SECRET = "bothy.thread_grouping"  # noqa: S105 - a name, not a value
"""The secret store's name of the grouping key."""
GROUP_LENGTH = 32
"""Characters of a grouping value: RFC 8030's ``Topic`` is at most 32 base64url
characters (192 bits of the HMAC)."""
_CACHE_MAX = 65_536
"""Threads whose value is kept (one HMAC per push otherwise); cleared when full."""


def new_key() -> str:
    """A new grouping key: 32 random bytes, base64url."""
    return secrets.token_urlsafe(32)


class ThreadGrouping:
    """The grouping value of each thread under one key (its repr shows nothing)."""

    def __init__(self, key: str) -> None:
        if not key:
            raise ValueError("the grouping key is empty")
        self._key = key.encode()
        self._cache: dict[str, str] = {}

    def of(self, thread_id: str) -> str:
        """The thread's grouping value: 32 base64url characters."""
        found = self._cache.get(thread_id)
        if found is None:
            digest = hmac.new(self._key, thread_id.encode(), hashlib.sha256).digest()
            found = base64.urlsafe_b64encode(digest).decode()[:GROUP_LENGTH]
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[thread_id] = found
        return found

    def __repr__(self) -> str:
        return "ThreadGrouping()"


__all__ = ["GROUPING_SECRET", "GROUP_LENGTH", "ThreadGrouping", "new_key"]
