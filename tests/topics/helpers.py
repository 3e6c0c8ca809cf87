"""Helpers of the topic-mode tests: recipients with their secrets, topics, envelopes,
and the three endpoints called over real HTTP on a running node."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from bothy_notify.topics.model import b64, epoch_of
from tests.harness import Node, device_token

DEVICE = device_token("topic-app", "topic-device")
"""Any valid device token opens the topic endpoints (no claim binds a recipient)."""


def conversation() -> bytes:
    """A fresh conversation topic (kind 0x00, 16-byte id)."""
    return b"\x00" + os.urandom(16)


def welcome_topic() -> bytes:
    """A fresh welcome topic (kind 0x01, 32-byte installation id)."""
    return b"\x01" + os.urandom(32)


def hmac_key() -> bytes:
    return os.urandom(42)


@dataclass
class Recipient:
    """A client's identity: 32-byte id and secret (the test keeps the secret)."""

    recipient_id: bytes = field(default_factory=lambda: os.urandom(32))
    secret: bytes = field(default_factory=lambda: os.urandom(32))

    def identity(self) -> dict[str, str]:
        return {"recipient_id": b64(self.recipient_id), "recipient_secret": b64(self.secret)}


async def call(node: Node, path: str, body: Any, token: str = DEVICE) -> httpx.Response:
    return await node.request("POST", f"/v1/recipients/{path}", token=token, json=body)


async def register(
    node: Node, who: Recipient, channel: str = "fake", token: str = "tok-ok", **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {**who.identity(), "channel": channel, **extra}
    if channel != "webhook":
        body["token"] = token
    return await call(node, "register", body)


def add(
    topic: bytes,
    *,
    keys: list[bytes] | None = None,
    base: int | None = None,
    include_commits: bool | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": b64(topic)}
    if keys is not None:
        out["hmac_keys"] = [b64(k) for k in keys]
    if base is not None:
        out["hmac_epoch_base"] = base
    if include_commits is not None:
        out["include_commits"] = include_commits
    return out


async def subscribe(
    node: Node,
    who: Recipient,
    adds: list[dict[str, Any]] | None = None,
    removes: list[bytes] | None = None,
) -> httpx.Response:
    body = {**who.identity(), "adds": adds or [], "removes": [b64(t) for t in removes or []]}
    return await call(node, "subscriptions", body)


def window(key: bytes, *, offset: int = -1) -> dict[str, Any]:
    """A key window holding ``key`` in every slot, starting ``offset`` epochs from the
    present one. Envelopes take their epoch from the database's clock (the append
    time), which is the real one, so the window follows real time."""
    current = epoch_of(datetime.now(UTC))
    return {"keys": [key, key, key], "base": current + offset}


def envelope(
    topic: bytes,
    *,
    kind: str = "application",
    should_push: bool = True,
    data: bytes | None = None,
    sender_key: bytes | None = None,
) -> dict[str, Any]:
    """An ``envelope.published`` event; signed with ``sender_key`` when given."""
    data = os.urandom(64) if data is None else data
    payload: dict[str, Any] = {
        "topic": b64(topic),
        "kind": kind,
        "should_push": should_push,
        "data": b64(data),
    }
    if sender_key is not None:
        payload["sender_hmac"] = b64(hmac.digest(sender_key, data, "sha256"))
    return {"type": "envelope.published", "payload": payload}


def topic_sends(node: Node) -> list[dict[str, Any]]:
    """The fake provider's topic pushes: payload plus the recipient (hex)."""
    return [
        {**s.payload, "to": s.registration_id}
        for s in node.fake.sends
        if set(s.payload) == {"topic", "sequence_id"}
    ]
