"""What the real providers share: bounds, TLS, Retry-After, and safe reason codes.

Every provider request and every token fetch is bounded by
:data:`REQUEST_BOUND`, applied by the provider as a cancel scope around the
call. Reasons that end up in an :class:`~.port.Outcome` (and from there in a
registration's ``last_error``, a log line or a printed report) are reduced to
short codes by :func:`safe_reason`, so nothing a provider echoes back (a token,
a URL) can leak through them.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpcore
import httpx
import trio

from bothy_notify.config import ConfigError

REQUEST_BOUND = 10.0
"""Seconds one provider request or token fetch may take (SPEC section 10)."""
RETRY_AFTER_CAP = timedelta(seconds=300)
"""Longest provider Retry-After honoured; a longer one is cut to this."""

_REASON = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    """The provider answered: a status (any, 5xx included), header lines and a body.

    ``head`` holds the raw header lines as received (the status line first);
    :meth:`header` reads one.
    """

    status: int
    head: tuple[bytes, ...] = ()
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` (case-insensitive), or ``None``."""
        wanted = name.lower().encode("ascii")
        found: str | None = None
        for line in self.head:
            key, sep, value = line.partition(b":")
            if sep and key.strip().lower() == wanted:
                found = value.strip().decode("latin-1")
        return found

    def __repr__(self) -> str:
        return f"ProviderAnswer(status={self.status})"


@dataclass(frozen=True, slots=True)
class NoAnswer:
    """No answer came from the provider: ``reason`` says why (``connect_error``,
    ``dns_error``, ``tls_error``, ``protocol_error``, ``network_error``, ``timeout``,
    ``closed``). Not the provider's verdict: the failure was on the way, or ours."""

    reason: str


def safe_reason(text: object, fallback: str) -> str:
    """``text`` when it looks like a provider reason code (letters, digits, ``_``), else
    ``fallback``."""
    return text if isinstance(text, str) and _REASON.fullmatch(text) else fallback


def ssl_context(ca_file: str, *, key: str) -> ssl.SSLContext:
    """A verifying client TLS context: only ``ca_file`` when given, else the system's CAs.

    Raises :class:`ConfigError` naming ``key`` when the file cannot be read.
    """
    if not ca_file:
        return httpx.create_ssl_context()
    path = Path(ca_file)
    try:
        return ssl.create_default_context(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key}: cannot read a CA bundle from that file") from exc


def check_https_url(value: str, *, key: str) -> str:
    """``value`` without a trailing slash when it is an ``https://host[:port]`` URL.

    Raises :class:`ConfigError` naming ``key`` otherwise (the value is not shown).
    """
    try:
        url = httpx.URL(value)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"{key}: expected an https:// URL") from exc
    if url.scheme != "https" or not url.host or url.query or url.fragment:
        raise ConfigError(f"{key}: expected an https:// URL")
    return value.rstrip("/")


def parse_retry_after(value: str | None, now: datetime) -> timedelta | None:
    """A ``Retry-After`` header (seconds or an HTTP date) as a delay; ``None`` when absent
    or malformed."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return timedelta(seconds=int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(timedelta(0), when - now)


def retry_delay(minimum: timedelta, retry_after: timedelta | None) -> timedelta:
    """The provider's minimum, or a longer Retry-After cut to :data:`RETRY_AFTER_CAP`."""
    if retry_after is None:
        return minimum
    return max(minimum, min(retry_after, RETRY_AFTER_CAP))


def transport_reason(exc: BaseException) -> str:
    """A short code for a network failure (``connect_error``, ``tls_error``...); takes
    httpx and httpcore errors alike."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return "tls_error"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.TimeoutException | httpcore.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ProxyError | httpcore.ProxyError):
        return "proxy_error"
    if isinstance(exc, httpx.ConnectError | httpcore.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.ProtocolError | httpcore.ProtocolError):
        return "protocol_error"
    return "network_error"


class LogThrottle:
    """Lets a warning through at most once per ``period`` seconds per key, so a provider
    refusing every send does not flood the log (Trio time, not the wall clock)."""

    def __init__(self, period: float = 60.0) -> None:
        self._period = period
        self._last: dict[str, float] = {}

    def allow(self, key: str) -> bool:
        """Whether a line for ``key`` may be logged now."""
        now = trio.current_time()
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            return False
        self._last[key] = now
        return True

    def __repr__(self) -> str:
        return "LogThrottle()"
