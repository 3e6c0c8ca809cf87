"""The daemon's three recipient endpoints, as the reference client calls them.

:class:`RecipientApi` is the port; :class:`HttpRecipientApi` speaks HTTP JSON to
``POST /v1/recipients/{register,unregister,subscriptions}``. Every call is
bounded by :data:`REQUEST_TIMEOUT` (a cancel scope here, at the caller of the
network) and every failure becomes one of :mod:`bothy_notify.client.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx
import trio

from bothy_notify.client.errors import (
    NotificationError,
    RecipientNotFound,
    RetryableError,
    TerminalError,
    TopicLimitReached,
)
from bothy_notify.client.model import Delivery, RecipientState
from bothy_notify.topics.model import b64

REQUEST_TIMEOUT = 30.0
"""Seconds one notification request may take, so other work of the app waits at most that."""

NOT_REGISTERED = "recipient is not registered"
"""The daemon's constant message for an unknown recipient (404 also means "no such
endpoint" on a daemon without topic mode: that one is terminal)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The recipient id and secret; the repr shows neither."""

    recipient_id: bytes
    secret: bytes

    def body(self) -> dict[str, str]:
        return {"recipient_id": b64(self.recipient_id), "recipient_secret": b64(self.secret)}

    def __repr__(self) -> str:
        return "Identity(***)"


@dataclass(frozen=True, slots=True)
class Subscription:
    """One add: a topic, its key window (epoch of the first key) and commit flag."""

    topic: bytes
    include_commits: bool = False
    epoch_base: int | None = None
    keys: tuple[bytes, ...] = ()

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topic": b64(self.topic), "include_commits": self.include_commits}
        if self.keys and self.epoch_base is not None:
            out["hmac_epoch_base"] = self.epoch_base
            out["hmac_keys"] = [b64(k) for k in self.keys]
        return out

    def __repr__(self) -> str:
        return f"Subscription(keys={len(self.keys)}, include_commits={self.include_commits})"


class RecipientApi(Protocol):
    """The daemon, as the client sees it."""

    async def register(self, identity: Identity, delivery: Delivery) -> RecipientState: ...

    async def unregister(self, identity: Identity) -> None: ...

    async def update_subscriptions(
        self, identity: Identity, adds: Sequence[Subscription], removes: Sequence[bytes]
    ) -> RecipientState: ...


class HttpRecipientApi:
    """:class:`RecipientApi` over HTTP.

    Args:
        base_url: the daemon's API, e.g. ``http://127.0.0.1:8700``.
        token: the bearer token (a device or producer JWT), or a function that
            returns a fresh one for each call.
        client: an ``httpx.AsyncClient`` to reuse (one is made otherwise; close
            it with :meth:`aclose`).
    """

    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], str],
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._token = token
        self._own = client is None
        self._client = client or httpx.AsyncClient()

    def __repr__(self) -> str:
        return "HttpRecipientApi()"

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()

    async def register(self, identity: Identity, delivery: Delivery) -> RecipientState:
        body: dict[str, Any] = {**identity.body(), "channel": delivery.channel}
        for name in ("token", "environment", "url"):
            value = getattr(delivery, name)
            if value is not None:
                body[name] = value
        if delivery.signing_key is not None:
            body["signing_key"] = b64(delivery.signing_key)
        return _state(await self._post("register", body))

    async def unregister(self, identity: Identity) -> None:
        await self._post("unregister", identity.body())

    async def update_subscriptions(
        self, identity: Identity, adds: Sequence[Subscription], removes: Sequence[bytes]
    ) -> RecipientState:
        body = {
            **identity.body(),
            "adds": [a.body() for a in adds],
            "removes": [b64(t) for t in removes],
        }
        return _state(await self._post("subscriptions", body))

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        token = self._token() if callable(self._token) else self._token
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                response = await self._client.post(
                    f"{self._base}/v1/recipients/{path}",
                    json=body,
                    headers={"authorization": f"Bearer {token}"},
                    timeout=None,  # bounded by the cancel scope above
                )
        except trio.TooSlowError:
            raise RetryableError("timeout", "the request timed out") from None
        except httpx.HTTPError as exc:
            raise RetryableError("connection", type(exc).__name__) from None
        if response.status_code in (200, 204):
            return response.json() if response.status_code == 200 else {}
        raise _error(response)


def _error(response: httpx.Response) -> NotificationError:
    code, message = "http_error", f"HTTP {response.status_code}"
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        pass
    status = response.status_code
    if status == 404 and code == "not_found" and message == NOT_REGISTERED:
        return RecipientNotFound(code, message)
    if status == 429:
        return TopicLimitReached(code, message)
    if status in (400, 403, 404, 405, 409, 413, 501):
        # invalid_argument, permission_denied (or a refused token), failed_precondition,
        # and a daemon without these endpoints: retrying cannot help.
        return TerminalError(code, message)
    return RetryableError(code, message)


def _state(body: dict[str, Any]) -> RecipientState:
    try:
        return RecipientState(
            int(body["topic_count"]),
            str(body["channel"]),
            datetime.fromisoformat(str(body["expires_at"]).replace("Z", "+00:00")),
        )
    except (KeyError, TypeError, ValueError):
        raise RetryableError("bad_answer", "the daemon's answer is not a recipient state") from None
