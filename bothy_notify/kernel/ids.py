"""Identifiers: the shape of app IDs and the UUIDv7 IDs the daemon makes.

App IDs (users, devices, threads, messages, scopes) are opaque strings of 1 to
128 characters from ``[A-Za-z0-9._:-]``, so an app can keep its own. IDs the
daemon makes (``nid``, envelope ``id``) are UUIDv7: time-ordered, so they sort
by creation and index well.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
_ID_RE = re.compile(ID_PATTERN)


def is_valid_id(value: object) -> bool:
    """Whether ``value`` is a string of the app ID shape."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


class _Uuid7Source:
    """Monotonic UUIDv7 generation (RFC 9562) shared by the process.

    48 bits of Unix milliseconds, then a 12-bit counter that keeps IDs of this
    process increasing within one millisecond (when it runs out, the timestamp
    is borrowed from the next millisecond, so IDs never go backwards), then
    random bits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def next(self) -> uuid.UUID:
        return uuid.UUID(int=self.next_int())

    def next_int(self) -> int:
        """The next UUIDv7 as its 128-bit integer."""
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                self._counter += 1
                if self._counter > 0xFFF:
                    self._last_ms += 1
                    self._counter = 0
                ms = self._last_ms
            else:
                self._last_ms = ms
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
            counter = self._counter
        rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76
        value |= counter << 64
        value |= 0b10 << 62
        value |= rand
        return value


_source = _Uuid7Source()


def uuid7() -> uuid.UUID:
    """A new UUIDv7: time-ordered, increasing within this process."""
    return _source.next()


def new_id() -> str:
    """A new UUIDv7 as its canonical string (formatted here: ``str(uuid.UUID(...))``
    costs more, and the round makes one per event)."""
    h = "%032x" % _source.next_int()  # noqa: UP031 - the fastest formatting here
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


DAEMON_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
"""The form of the IDs the daemon makes (:func:`new_id`): a UUID, lowercase."""
_DAEMON_ID_RE = re.compile(DAEMON_ID_PATTERN)


def is_daemon_id(value: object) -> bool:
    """Whether ``value`` is a string of the form :func:`new_id` makes."""
    return isinstance(value, str) and _DAEMON_ID_RE.fullmatch(value) is not None
